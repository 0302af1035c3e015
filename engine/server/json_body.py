"""Every request body is read as JSON, whatever its Content-Type says, as Ollama and llama-server do.

Ollama's own documented request, `curl http://localhost:11434/api/generate -d '{"model": ...}'`,
goes out as `application/x-www-form-urlencoded` (curl's `-d`), and some clients send text/plain or
no type at all; FastAPI would hand such a body to the route as bytes and refuse it ("the request
body must be a JSON object"). Only OpenAI's file uploads (`UPLOAD_PATHS`) take multipart data, so
any other body whose type is missing or not JSON is declared JSON here, before the routes read it.

It runs inside SecurityMiddleware: a browser may send a text/plain POST without a CORS preflight
(a "simple request"), so a foreign page's body must be refused by the Origin check before it is
ever treated as JSON.
"""
from __future__ import annotations

from email.message import Message

BODILESS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON = (b"content-type", b"application/json")
UPLOAD_PATHS = frozenset({"/v1/files"})  # multipart/form-data, as OpenAI's Files API takes it


def is_json_type(content_type: str) -> bool:
    """`application/json`, `application/json; charset=utf-8`, `application/vnd.x+json`: FastAPI's own rule."""
    m = Message()
    m["content-type"] = content_type
    return m.get_content_maintype() == "application" and (
        m.get_content_subtype() == "json" or m.get_content_subtype().endswith("+json"))


class JSONBodyMiddleware:
    """A pure ASGI middleware: it rewrites the scope's Content-Type, never touches the body or the reply."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] not in BODILESS:
            headers = scope["headers"]
            given = [v for k, v in headers if k.lower() == b"content-type"]
            kind = given[0].decode("latin-1") if given else ""
            upload = scope["path"] in UPLOAD_PATHS and kind.lower().startswith("multipart/form-data")
            if not upload and not is_json_type(kind):
                scope = {**scope, "headers": [(k, v) for k, v in headers if k.lower() != b"content-type"] + [JSON]}
        await self.app(scope, receive, send)
