"""64 concurrent streaming clients on a tiny model, a quarter of them hanging up mid-stream.

The rest must finish cleanly ([DONE], a finish_reason, no error events), and afterwards the
engine must hold nothing: no running or waiting sequences and every KV block free.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import time
from urllib.parse import urlsplit

import httpx
import pytest
from server_util import LONG_CTX, long_max_tokens, start_engine

N_CLIENTS = 64
N_DISCONNECT = N_CLIENTS // 4

# every test here drives a real engine process (tens of seconds to start on 2 busy cores)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model_factory, tmp_path_factory):
    # a small KV pool, so that 64 clients also exercise waiting and preemption; a long context,
    # so that one request can run long enough (by its length, not the CPU's speed) to be left
    proc = start_engine(tiny_model_factory(ctx=LONG_CTX), tmp_path_factory.mktemp("load"),
                        "--num-kv-blocks", "160", "--max-num-seqs", "32")
    yield proc
    proc.stop()


async def _client(http: httpx.AsyncClient, i: int, hang_up_after: int | None, long: int) -> dict:
    body = {"messages": [{"role": "user", "content": f"Client {i}: tell me about the fox and the dog."}],
            "max_tokens": 48, "temperature": 0.8, "seed": i, "stream": True,
            "stream_options": {"include_usage": True}}
    if hang_up_after is not None:  # still running when it leaves, however fast the CPU
        body.update(max_tokens=long, ignore_eos=True)
    got = {"chunks": 0, "done": False, "finish": None, "errors": [], "usage": None, "status": None}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        got["status"] = r.status_code
        if r.status_code != 200:
            got["errors"].append((await r.aread()).decode())
            return got
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                got["done"] = True
                break
            event = json.loads(data)
            if "error" in event:
                got["errors"].append(event["error"])
                continue
            got["chunks"] += 1
            if event.get("usage"):
                got["usage"] = event["usage"]
            for c in event["choices"]:
                got["finish"] = c["finish_reason"] or got["finish"]
            if hang_up_after is not None and got["chunks"] >= hang_up_after:
                return got  # leaving the block closes the connection mid-stream
    return got


async def _run(server, long: int) -> list[dict]:
    limits = httpx.Limits(max_connections=N_CLIENTS + 4)
    async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers, limits=limits,
                                 timeout=httpx.Timeout(120)) as http:
        jobs = [_client(http, i, 3 + i % 5 if i % 4 == 0 else None, long) for i in range(N_CLIENTS)]
        return await asyncio.wait_for(asyncio.gather(*jobs), timeout=240)


def _status(server) -> dict:
    return httpx.get(server.base_url + "/v1/engine/status", headers=server.headers, timeout=10).json()


def test_64_streaming_clients_with_disconnects(server):
    long = long_max_tokens(server.base_url, server.api_key)
    before = _aborts(server)
    t0 = time.monotonic()
    results = asyncio.run(_run(server, long))
    elapsed = time.monotonic() - t0
    stayed = [r for i, r in enumerate(results) if i % 4 != 0]
    left = [r for i, r in enumerate(results) if i % 4 == 0]
    assert len(left) == N_DISCONNECT
    for r in stayed:
        assert r["status"] == 200 and not r["errors"], r
        assert r["done"] and r["finish"] in ("stop", "length"), r
        assert r["usage"]["completion_tokens"] >= 1
    assert all(r["status"] == 200 and not r["errors"] for r in left)
    # the aborted sequences free their KV at once; give the loop a moment to run its last step
    deadline = time.monotonic() + 10
    while True:
        s = _status(server)
        if (s["kv"]["blocks_used"], s["num_running"], s["num_waiting"], s["num_requests"]) == (0, 0, 0, 0):
            break
        assert time.monotonic() < deadline, s
        time.sleep(0.1)
    assert _aborts(server) - before == N_DISCONNECT  # every hang-up left a request still running
    print(f"64 clients in {elapsed:.1f}s")
    # and the server still serves
    r = httpx.post(server.base_url + "/v1/completions", headers=server.headers,
                   json={"prompt": "hello", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200


def test_non_streaming_client_hanging_up_is_aborted(server):
    """A non-streaming request whose client leaves is aborted too, not generated to the end."""
    n = long_max_tokens(server.base_url, server.api_key)
    before, generated = _aborts(server), _metric(server, "ember_generation_tokens_total")
    body = {"prompt": "The fox", "max_tokens": n, "ignore_eos": True, "temperature": 0}
    url = urlsplit(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(body),
                 headers={**server.headers, "Content-Type": "application/json"})
    deadline = time.monotonic() + 60
    while not _status(server)["num_running"]:  # hang up only once it is generating
        assert time.monotonic() < deadline, _status(server)
        time.sleep(0.01)
    conn.close()
    deadline = time.monotonic() + 10
    while _aborts(server) == before or _status(server)["num_running"]:
        assert time.monotonic() < deadline, _status(server)
        time.sleep(0.05)
    assert _aborts(server) == before + 1
    assert _status(server)["kv"]["blocks_used"] == 0
    assert _metric(server, "ember_generation_tokens_total") - generated < n  # not generated to the end


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics", headers=server.headers).text
    return next(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name))


def _aborts(server) -> float:
    return _metric(server, "ember_request_aborts_total")
