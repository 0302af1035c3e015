"""An image part's http(s) URL, fetched only where the user allowed it: the `fetch_image_urls`
setting (`ember serve --fetch-image-urls`), off by default, since the engine must make no request
a user did not ask for. When on: http and https only, TLS verified (httpx's default), no step down
from https to http on a redirect, at most MAX_REDIRECTS redirects, at most MAX_IMAGE_BYTES read
and FETCH_TIMEOUT_S in all; every failure is a FetchError saying which, for the part's 400.
"""
from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx

from engine.images import MAX_IMAGE_BYTES

SETTING = "fetch_image_urls"  # the app's setting, and the serve flag --fetch-image-urls
FETCH_TIMEOUT_S = 15.0
MAX_REDIRECTS = 3


class FetchError(ValueError):
    """An image URL that could not be fetched; the message says why."""


def fetch_image(url: str, *, limit: int = MAX_IMAGE_BYTES, timeout_s: float = FETCH_TIMEOUT_S) -> bytes:
    """The bytes at `url` (an http(s) URL answering 200 with at most `limit` bytes within `timeout_s`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("only http and https image URLs are fetched")
    deadline = time.monotonic() + timeout_s
    try:
        with httpx.Client(timeout=timeout_s, follow_redirects=True, max_redirects=MAX_REDIRECTS,
                          headers={"User-Agent": "ember", "Accept": "image/*"}) as client:
            with client.stream("GET", url) as r:
                if parts.scheme == "https" and r.url.scheme != "https":
                    raise FetchError(f"the URL redirected from https to {r.url.scheme}: refused")
                if r.status_code != 200:
                    raise FetchError(f"fetching the URL answered HTTP {r.status_code} {r.reason_phrase}")
                length = r.headers.get("content-length", "")
                if length.isdigit() and int(length) > limit:
                    raise FetchError(f"the image at the URL is {int(length) / 2**20:.1f} MiB; the limit is "
                                     f"{limit >> 20} MiB")
                data = bytearray()
                for chunk in r.iter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise FetchError(f"the image at the URL is over the {limit >> 20} MiB limit")
                    if time.monotonic() > deadline:
                        raise FetchError(f"fetching the URL took over {timeout_s:g} s")
                return bytes(data)
    except httpx.TooManyRedirects:
        raise FetchError(f"the URL redirected more than {MAX_REDIRECTS} times") from None
    except httpx.TimeoutException:
        raise FetchError(f"fetching the URL took over {timeout_s:g} s") from None
    except httpx.HTTPError as e:  # refused, unreachable, TLS not verified, a scheme httpx does not speak
        raise FetchError(f"the URL could not be fetched: {e or type(e).__name__}") from None
