"""One streaming chat over HTTP, timed at the client: the request the server benches send."""
from __future__ import annotations

import json
import time


async def stream_chat(http, i: int, max_tokens: int, model: str | None = None) -> dict:
    """Chat `i` (its own prompt and seed) of exactly `max_tokens` tokens (ignore_eos), streamed:
    its time to the first content chunk, tokens, and decode tok/s after that chunk. `model`: the
    one to ask (None: the server's newest)."""
    body = {"model": model, "messages": [{"role": "user", "content": f"Write a long story about a fox (#{i})."}],
            "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, last, usage, chunks = None, None, None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                usage = event["usage"]
            if event["choices"] and event["choices"][0]["delta"].get("content"):
                last = time.perf_counter()
                chunks += 1
                ttft = ttft if ttft is not None else last - t0
    n = usage["completion_tokens"] if usage else chunks
    decode_s = (last - t0 - ttft) if (ttft is not None and last) else 0.0
    return {"ttft": ttft or 0.0, "tokens": n, "stream_tok_s": (n - 1) / decode_s if decode_s > 0 else 0.0}
