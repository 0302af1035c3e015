"""Who may talk to a real server process: API key, Host allowlist (DNS rebinding), Origin, CORS,
and the refusal to listen beyond this machine without an explicit flag and a key."""
from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from server_util import start_engine, tiny_model

# every test here drives a real engine process (tens of seconds to start on 2 busy cores)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path_factory.mktemp("sec"),
                        "--cors-origin", "http://app.example:3000")
    yield proc
    proc.stop()


def _get(server, path="/v1/models", headers=None, key=True):
    h = dict(server.headers) if key else {}
    h.update(headers or {})
    return httpx.get(server.base_url + path, headers=h, timeout=10)


def _shape(r, status, code):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code and err["message"]


def test_api_key_required(server):
    _shape(_get(server, key=False), 401, "invalid_api_key")
    _shape(_get(server, key=False, headers={"Authorization": "Bearer nope"}), 401, "invalid_api_key")
    _shape(_get(server, key=False, headers={"Authorization": f"Basic {server.api_key}"}), 401, "invalid_api_key")
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    _shape(r, 401, "invalid_api_key")
    assert _get(server).status_code == 200
    assert _get(server, "/health", key=False).status_code == 200  # the supervisor polls it


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.nip.io", "192.168.1.5",
                                  "localhost.evil.example", ""])
def test_foreign_host_header_refused(server, host):
    _shape(_get(server, headers={"Host": host}), 403, "forbidden_host")


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "[::1]:8765", "LOCALHOST"])
def test_loopback_host_header_allowed(server, host):
    assert _get(server, headers={"Host": host}).status_code == 200


def test_origin_checked(server):
    _shape(_get(server, headers={"Origin": "http://evil.example"}), 403, "forbidden_origin")
    _shape(_get(server, headers={"Origin": "null"}), 403, "forbidden_origin")
    same = f"http://127.0.0.1:{server.port}"
    assert _get(server, headers={"Origin": same}).status_code == 200
    r = _get(server, headers={"Origin": "http://app.example:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example:3000"


def test_cors_preflight_only_for_configured_origin(server):
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    ok = httpx.options(server.base_url + "/v1/chat/completions", headers={"Origin": "http://app.example:3000", **pre})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://app.example:3000"
    bad = httpx.options(server.base_url + "/v1/chat/completions", headers={"Origin": "http://evil.example", **pre})
    assert "access-control-allow-origin" not in bad.headers and bad.status_code >= 400


def test_body_size_limit(server):
    r = httpx.post(server.base_url + "/v1/completions", headers=server.headers,
                   content=b'{"prompt": "' + b"a" * (17 << 20) + b'"}')
    _shape(r, 413, "request_too_large")
    assert _get(server).status_code == 200


def _serve(*args, env_key: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "EMBER_API_KEY": env_key or ""}
    return subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_non_loopback_bind_refused():
    r = _serve("--host", "0.0.0.0")
    assert r.returncode == 2 and "--allow-remote" in r.stderr
    r = _serve("--host", "0.0.0.0", "--allow-remote")
    assert r.returncode == 2 and "API key" in r.stderr


def test_ember_serve_takes_key_and_store_from_settings(tiny_model_factory, tmp_path):
    """`ember serve` is the same server, with the user's settings as defaults (key included)."""
    import json
    import os
    import time

    home = tmp_path / "home"
    env = {**os.environ, "EMBER_HOME": str(home)}
    env.pop("EMBER_API_KEY", None)
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "app", "serve", "--port", "0", "--ready-file", str(ready),
                             "--model", str(tiny_model(tiny_model_factory)), "--num-kv-blocks", "64",
                             "--backend", "torch", "--threads", "1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        base = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
        key = json.loads((home / "config" / "settings.json").read_text())["api_key"]
        assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(base + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
