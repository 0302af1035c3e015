"""Who may talk to the engine: Host allowlist, Origin check, Bearer API key, body size.

- Host: a page on evil.example can re-point its DNS name at 127.0.0.1 (DNS rebinding) and then
  call us "same-origin"; its requests still carry `Host: evil.example`. So only loopback names
  (localhost, 127.0.0.1, [::1], any port) pass, plus what the operator allows for a remote bind.
- Origin: a browser page from another origin is refused unless its origin is configured for
  CORS; requests without an Origin (curl, the openai client, our app) are not browser requests.
- API key: `Authorization: Bearer <key>` (or `x-api-key: <key>`, as Anthropic's clients send it),
  compared in constant time; /health stays open so a supervisor can poll it (it reveals only the
  state and the model's name).
- Keyless ports: Ollama's clients mostly have no field for a key, so where the user allows it
  ("Ollama's port too", `--ollama-keyless`) a client on this machine (a loopback peer address,
  from the ASGI scope's "client") is served without one on that port (the scope's "server").
  Host and Origin are checked there as everywhere, so a web page still cannot reach it.
A pure ASGI middleware, so streaming responses pass through untouched.
"""
from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from starlette.exceptions import HTTPException

from engine.server.json_body import UPLOAD_PATHS

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})
OPEN_PATHS = frozenset({"/health"})


def is_loopback(host: str) -> bool:
    h = host.strip("[]").lower()
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def host_name(host_header: str) -> str:
    """'localhost:8765' -> 'localhost'; '[::1]:80' -> '::1'; bare IPv6 stays whole."""
    h = host_header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        return h.split(":", 1)[0]
    return h


def check_bind(host: str, allow_remote: bool, api_key: str | None) -> None:
    """Refuse to listen beyond this machine unless asked explicitly AND protected by a key."""
    if is_loopback(host):
        return
    if not allow_remote:
        raise ValueError(f"refusing to bind {host!r}: it is reachable from other machines. Pass "
                         "--allow-remote (and an --api-key) if that is what you want, or use 127.0.0.1.")
    if not api_key:
        raise ValueError(f"refusing to bind {host!r} without an API key: anyone on the network could "
                         "use the engine. Set --api-key (or EMBER_API_KEY).")


@dataclass(frozen=True)
class SecurityPolicy:
    api_key: str | None = None
    allowed_hosts: frozenset[str] = frozenset()  # extra Host names ("*" allows any), for remote binds
    cors_origins: frozenset[str] = frozenset()  # browser origins allowed ("*" allows any)
    max_body_bytes: int = 16 << 20
    max_upload_bytes: int = 512 << 20  # a file upload (UPLOAD_PATHS): a document, as large as one may be
    open_paths: frozenset[str] = field(default=OPEN_PATHS)
    keyless_ports: frozenset[int] = frozenset()  # where a client on this machine needs no key (Ollama's)

    @classmethod
    def build(cls, api_key: str | None = None, allowed_hosts: Iterable[str] = (),
              cors_origins: Iterable[str] = (), keyless_ports: Iterable[int] = (), **kw) -> "SecurityPolicy":
        return cls(api_key or None, frozenset(h.lower() for h in allowed_hosts),
                   frozenset(o.rstrip("/").lower() for o in cors_origins),
                   keyless_ports=frozenset(keyless_ports), **kw)

    def keyless(self, server: tuple | None, client: tuple | None) -> bool:
        """A request from this machine (`client`: the peer's address) to a keyless port (`server`: the
        listening socket's address, as the ASGI scope gives both)."""
        return bool(server and client and server[1] in self.keyless_ports and is_loopback(str(client[0])))

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name = host_name(host_header)
        return is_loopback(name) or "*" in self.allowed_hosts or name in self.allowed_hosts

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        origin = origin.rstrip("/").lower()
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        # same-origin requests from a page this server itself served
        return origin in (f"http://{host_header.lower()}", f"https://{host_header.lower()}")

    def key_ok(self, authorization: str | None, x_api_key: str | None = None) -> bool:
        if not self.api_key:
            return True
        if x_api_key and hmac.compare_digest(x_api_key.strip().encode(), self.api_key.encode()):
            return True
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(token.strip().encode(), self.api_key.encode())


class SecurityMiddleware:
    def __init__(self, app, policy: SecurityPolicy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        p = self.policy
        host = headers.get("host", "")
        if not p.host_allowed(host):
            return await _deny(send, 403, "this server only answers requests addressed to localhost "
                               f"(Host header {host[:100]!r} is not allowed)", "forbidden_host")
        origin = headers.get("origin")
        if origin is not None and origin != "null" and not p.origin_allowed(origin, host):
            return await _deny(send, 403, f"browser requests from origin {origin[:100]!r} are not "
                               "allowed (configure --cors-origin to allow one)", "forbidden_origin")
        if origin == "null":
            return await _deny(send, 403, "browser requests from an opaque origin are not allowed",
                               "forbidden_origin")
        is_preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in headers
        key_ok = (p.keyless(scope.get("server"), scope.get("client"))
                  or p.key_ok(headers.get("authorization"), headers.get("x-api-key")))
        if not is_preflight and scope["path"] not in p.open_paths and not key_ok:
            given = headers.get("authorization") or headers.get("x-api-key")
            msg = "invalid API key" if given else "missing API key: send 'Authorization: Bearer <key>'"
            return await _deny(send, 401, msg, "invalid_api_key", {"www-authenticate": "Bearer"})
        length = headers.get("content-length")
        limit = p.max_upload_bytes if scope["path"] in UPLOAD_PATHS else p.max_body_bytes
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _deny(send, 413, f"request body larger than {limit} bytes", "request_too_large")
        await self.app(scope, _limited(receive, limit), send)


def _limited(receive, limit: int):
    """Count body bytes of chunked uploads too (no Content-Length to check up front)."""
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:  # FastAPI passes HTTPException through; errors.py shapes it
                raise HTTPException(413, f"request body larger than {limit} bytes")
        return message
    return wrapped


async def _deny(send, status: int, message: str, code: str, headers: dict | None = None) -> None:
    types = {401: "authentication_error", 403: "permission_error", 413: "invalid_request_error"}
    body = json.dumps({"error": {"message": message, "type": types[status], "param": None,
                                 "code": code}}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
