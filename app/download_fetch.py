"""One file over HTTP into a `.part` file, resuming with a Range request from the bytes on disk.

One call is one attempt; the caller retries `RetryableError` with backoff. The `.part` file
only ever holds a correct prefix of the remote file (a server that ignores Range, or resumes at
the wrong offset, makes us start again from zero), so a resume after any failure — including the
process being killed — is safe; the sha256 check at the end is the final word.
"""
from __future__ import annotations

import errno
import os
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

_SHA_RE = re.compile(r'^(?:W/)?"?([0-9a-f]{64})"?$')
_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RE = re.compile(r"bytes \*/(\d+)")


class DownloadError(Exception):
    """A failure that retrying will not fix (404, checksum, disk full); the message says which."""


class RetryableError(Exception):
    """A failure worth another attempt (dropped connection, truncated body, 5xx, timeout)."""


class Stopped(Exception):
    """The job was paused or cancelled while transferring."""


@dataclass
class FetchResult:
    total: int | None  # the remote file's size, when the server said
    hub_sha256: str | None  # sha256 the hub published in X-Linked-Etag / ETag, if any
    restarted: bool  # the server ignored our Range and we started from zero


def hub_sha256(response: httpx.Response) -> str | None:
    """The Hugging Face hub sends an LFS file's sha256 as X-Linked-Etag (on the redirect) or ETag."""
    for r in (*response.history, response):
        for key in ("x-linked-etag", "etag"):
            value = r.headers.get(key)
            if value and (m := _SHA_RE.match(value.strip().lower())):
                return m.group(1)
    return None


def fetch_to_part(client: httpx.Client, url: str, part: Path, *, expected_size: int | None,
                  expected_sha256: str | None = None,
                  on_bytes: Callable[[int], None], should_stop: Callable[[], bool],
                  check_space: Callable[[int], None], on_total: Callable[[int], None] = lambda n: None,
                  opener=open, chunk_size: int = 1 << 16) -> FetchResult:
    """Append the rest of `url` to `part`; returns once the file is complete on disk (fsynced).

    `on_bytes(n)` gets the number of bytes of this file on disk so far (it can drop to 0 when
    the server ignores Range); `check_space(n)` raises when n more bytes will not fit; `on_total(n)`
    learns the file's size from the response headers.
    """
    offset = part.stat().st_size if part.exists() else 0
    if expected_size is not None and offset > expected_size:
        part.unlink()  # longer than the file can be: not a prefix of it
        offset = 0
    if expected_size is not None and offset == expected_size and offset > 0:
        return FetchResult(expected_size, None, False)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        with client.stream("GET", url, headers=headers) as r:
            if url.startswith("https:") and r.url.scheme != "https":
                raise DownloadError(f"{url} redirected to {r.url.scheme}://{r.url.host}: refusing to leave TLS")
            published = hub_sha256(r)
            if expected_sha256 and published and published != expected_sha256:
                raise DownloadError(f"{url}: the hub publishes sha256 {published}, but {expected_sha256} is "
                                    "expected; refusing the file")
            return _receive(r, url, part, offset, expected_size, on_bytes, should_stop,
                            check_space, on_total, opener, chunk_size)
    except httpx.HTTPError as e:  # connect/read timeouts, dropped connections, truncated bodies
        if _is_certificate_error(e):  # retrying will not make an untrusted server trusted
            raise DownloadError(f"TLS certificate verification failed for {url}: {e}") from e
        if _is_name_lookup_error(e):  # offline (no DNS): not a blip that seconds of retrying fix
            raise DownloadError(f"no network: cannot look up {httpx.URL(url).host} "
                                "(check the connection, then Retry)") from e
        raise RetryableError(f"{type(e).__name__}: {e or 'connection failed'} ({url})") from e


def _is_name_lookup_error(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, socket.gaierror) or "Name or service not known" in str(e) \
                or "Temporary failure in name resolution" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _is_certificate_error(e: BaseException) -> bool:
    while e is not None:
        if isinstance(e, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _receive(r: httpx.Response, url, part: Path, offset, expected_size, on_bytes, should_stop,
             check_space, on_total, opener, chunk_size) -> FetchResult:
    held = _check_status(r, url, part, offset)
    if held is not None:
        return held
    offset, total, restarted = _body_range(r, url, part, offset)
    if expected_size is not None and total is not None and total != expected_size:
        raise DownloadError(f"{url}: the server's file has {total} bytes, expected {expected_size}")
    if total is not None:
        check_space(total - offset)
        on_total(total)
    received = _write_body(r, part, offset, total, on_bytes, should_stop, opener, chunk_size)
    if total is not None and received != total:
        if received > total:
            part.unlink(missing_ok=True)
            raise RetryableError(f"server sent more than {total} bytes; starting again")
        raise RetryableError(f"truncated body: got {received} of {total} bytes")
    return FetchResult(total, hub_sha256(r), restarted)


def _check_status(r: httpx.Response, url, part: Path, offset: int) -> FetchResult | None:
    """Raise for an error status (retryable or not); a FetchResult when a 416 says we hold every byte."""
    status = r.status_code
    if status == 416 and offset:
        m = _UNSATISFIED_RE.fullmatch(r.headers.get("content-range", ""))
        if m and int(m.group(1)) == offset:
            return FetchResult(offset, hub_sha256(r), False)  # we already hold every byte
        part.unlink(missing_ok=True)
        raise RetryableError(f"server refused to resume at byte {offset}; starting again")
    if status in (408, 429) or status >= 500:
        raise RetryableError(f"HTTP {status} {r.reason_phrase} from {url}")
    if status >= 400:
        raise DownloadError(f"HTTP {status} {r.reason_phrase}: {url}")
    return None


def _body_range(r: httpx.Response, url, part: Path, offset: int) -> tuple[int, int | None, bool]:
    """(the offset the body starts at, the file's total size if known, whether it restarted at 0)."""
    status = r.status_code
    if status == 206:
        m = _RANGE_RE.fullmatch(r.headers.get("content-range", ""))
        if not m or int(m.group(1)) != offset:
            part.unlink(missing_ok=True)
            raise RetryableError(f"server resumed at the wrong offset ({r.headers.get('content-range')!r}); "
                                 "starting again")
        return offset, (int(m.group(3)) if m.group(3) != "*" else None), False
    if status == 200:
        length = r.headers.get("content-length")
        total = int(length) if length and length.isdigit() else None
        if offset:  # no range support: what we hold is useless, the body starts at byte 0
            return 0, total, True
        return offset, total, False
    raise DownloadError(f"unexpected HTTP {status} {r.reason_phrase}: {url}")


def _write_body(r: httpx.Response, part: Path, offset: int, total: int | None, on_bytes, should_stop,
                opener, chunk_size) -> int:
    """Append the body to the .part file (fsynced however it ends); returns the bytes it then holds."""
    received = offset
    on_bytes(received)
    with opener(part, "ab" if offset else "wb", buffering=0) as fh:  # unbuffered: a failed write leaves nothing pending
        try:
            for chunk in r.iter_bytes(chunk_size):
                if should_stop():
                    raise Stopped()
                _write_all(fh, chunk)
                received += len(chunk)
                on_bytes(received)
                if total is not None and received > total:
                    break
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DownloadError(f"disk full while writing {part.name} ({received} bytes kept); "
                                    "free some space and resume") from e
            raise DownloadError(f"cannot write {part}: {e}") from e
        finally:
            try:
                os.fsync(fh.fileno())
            except OSError:
                pass
    return received


def _write_all(fh, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = fh.write(view)
        if n is None:  # non-blocking file said "try again"; regular files never do
            continue
        view = view[n:]
