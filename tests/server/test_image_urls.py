"""http(s) image URLs, fetched by a server started with --fetch-image-urls (the fetch_image_urls
setting; off by default, see test_openai_images.py) from a local HTTP server serving a PNG: the
fetched picture is the same image as the same PNG sent as a data: URI (the same log-probabilities),
on OpenAI's chat, the Responses API and Anthropic's url source. A 404, bytes that are no image, a
file over the size cap, an https server whose certificate is not trusted: each a 400 naming the part.
The Responses API's file_id (an image uploaded to /v1/files) is the same picture too. The fetch's
own limits (size, time) are checked on `fetch_image` directly against a stalling server."""
from __future__ import annotations

import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from engine.images import MAX_IMAGE_BYTES
from engine.server.image_fetch import FetchError, fetch_image
from server_util import openai_client, start_engine
from store_helpers import self_signed_cert
from vision_util import GEMMA_TEMPLATE, ask, data_uri, image, lps, png_bytes, responses_input
from vlm_factory import write_tiny_vlm


class Pictures:
    """A local HTTP(S) server: path -> (status, body, seconds to stall before the body)."""

    def __init__(self, routes: dict, tls=None) -> None:
        routes_ = routes

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                status, body, stall = routes_.get(self.path, (404, b"missing", 0))
                self.send_response(status)
                if status in (301, 302):
                    self.send_header("Location", body.decode())
                    body = b""
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    time.sleep(stall)
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def pictures():
    site = Pictures({"/cat.png": (200, png_bytes(1), 0), "/words.txt": (200, b"no picture here", 0),
                     "/huge.png": (200, b"\0" * (MAX_IMAGE_BYTES + 1), 0), "/moved": (302, b"/cat.png", 0),
                     "/slow.png": (200, png_bytes(1), 5)})
    yield site
    site.close()


@pytest.fixture(scope="module")
def fetching_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fetching")
    vlm = write_tiny_vlm(tmp, chat_template=GEMMA_TEMPLATE)
    proc = start_engine(vlm.model, tmp, "--mmproj", str(vlm.mmproj), "--fetch-image-urls",
                        "--docs-dir", str(tmp / "docs"), backend="llama.cpp")
    yield proc, vlm
    proc.stop()


def test_a_fetched_picture_is_the_same_image_as_its_data_uri(fetching_server, pictures):
    client = openai_client(fetching_server[0])
    same = lps(ask(client, image(data_uri(1))))
    assert lps(ask(client, image(pictures.base + "/cat.png"))) == same
    assert lps(ask(client, image(pictures.base + "/moved"))) == same  # a redirect is followed
    r = client.responses.create(model="lm", input=responses_input({"type": "input_image", "image_url": pictures.base + "/cat.png"}),
                                max_output_tokens=2, temperature=0)
    by_data = client.responses.create(model="lm", input=responses_input({"type": "input_image", "image_url": data_uri(1)}),
                                      max_output_tokens=2, temperature=0)
    assert r.output_text == by_data.output_text and r.usage.input_tokens == by_data.usage.input_tokens


@pytest.mark.parametrize("path, says", [
    ("/missing.png", "HTTP 404"),
    ("/words.txt", "not an image"),
    ("/huge.png", "limit is 10 MiB"),
])
def test_a_url_that_gives_no_picture_is_a_400_naming_it(fetching_server, pictures, path, says):
    client = openai_client(fetching_server[0])
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, image(data_uri(1)), image(pictures.base + path))
    assert e.value.body["param"] == "messages[0].content[2]" and says in e.value.body["message"]


def test_tls_is_verified(fetching_server, tmp_path):
    tls = self_signed_cert(tmp_path)
    if tls is None:
        pytest.skip("no openssl CLI to make a certificate")
    site = Pictures({"/cat.png": (200, png_bytes(1), 0)}, tls=tls)
    try:
        with pytest.raises(openai.BadRequestError) as e:
            ask(openai_client(fetching_server[0]), image(site.base + "/cat.png"))
        assert "could not be fetched" in e.value.body["message"] and "CERTIFICATE_VERIFY_FAILED" in e.value.body["message"]
    finally:
        site.close()


def test_anthropic_url_sources_are_fetched(fetching_server, pictures):
    import anthropic

    proc, vlm = fetching_server
    client = anthropic.Anthropic(base_url=proc.base_url, api_key=proc.api_key, max_retries=0, timeout=120)
    block = {"type": "image", "source": {"type": "url", "url": pictures.base + "/cat.png"}}
    r = client.messages.create(model="lm", max_tokens=2, messages=[{"role": "user", "content": [block]}])
    assert r.usage.input_tokens >= vlm.image_tokens


def test_responses_file_id_is_the_uploaded_picture(fetching_server):
    client = openai_client(fetching_server[0])
    uploaded = client.files.create(file=("cat.png", png_bytes(1), "image/png"), purpose="vision")
    by_file = client.responses.create(model="lm", max_output_tokens=2, temperature=0,
                                      input=responses_input({"type": "input_image", "file_id": uploaded.id}))
    by_data = client.responses.create(model="lm", max_output_tokens=2, temperature=0,
                                      input=responses_input({"type": "input_image", "image_url": data_uri(1)}))
    assert by_file.output_text == by_data.output_text and by_file.usage.input_tokens == by_data.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="lm", input=responses_input({"type": "input_image", "file_id": "file-nope"}))
    assert e.value.body["param"] == "input[0].content[1]" and "no uploaded file 'file-nope'" in e.value.body["message"]


def test_the_fetch_keeps_to_its_limits(pictures):
    assert fetch_image(pictures.base + "/cat.png") == png_bytes(1)
    with pytest.raises(FetchError, match="took over 0.5 s"):
        fetch_image(pictures.base + "/slow.png", timeout_s=0.5)
    with pytest.raises(FetchError, match="limit is 0 MiB|over the 0 MiB limit"):
        fetch_image(pictures.base + "/cat.png", limit=100)
    with pytest.raises(FetchError, match="only http and https"):
        fetch_image("file:///etc/passwd")
