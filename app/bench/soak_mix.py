"""The requests `ember bench soak` sends: a fixed mix, so every round does the same kinds of work.

Request k of the run (counted over all rounds) is chosen from k alone: a short, medium or long
prompt (the long ones share a system prompt, as chats do, so the prefix cache is exercised), chat
or completions, streamed or not, a stop string, logprobs, and a reply of 1/3, 2/3 or all of
max_tokens. One streamed request in eight hangs up after a few chunks while its reply (ignore_eos)
is still running: the server must abort it and free its KV. Prompts differ per k, so nothing is
answered from a cache whole.
"""
from __future__ import annotations

import asyncio
import json
import time

SYSTEM = ("You are a patient assistant who answers questions about foxes, rivers and the small towns "
          "along them. Keep answers short, concrete and friendly. ")  # repeated 6 times at scale 1
TOPICS = ("the fox and the dog", "a river in spring", "a town that builds boats", "the night train",
          "a lighthouse keeper", "bread from a stone oven", "a cat on a fence", "snow in the mountains")


def request_for(k: int, max_tokens: int, scale: float = 1.0) -> tuple[str, dict, bool]:
    """(path, body, hang_up) for request k; `scale` shortens (or lengthens) the long prompts."""
    topic = TOPICS[k % len(TOPICS)]
    length = k % 3
    system = SYSTEM * max(1, round(6 * scale))
    user = f"Request {k}: tell me about {topic}." + (f" Mention {topic} twice. " * max(1, round(12 * scale))
                                                      if length == 1 else "")
    stream = k % 2 == 0
    hang_up = stream and k % 8 == 0
    body: dict = {"max_tokens": max(4, max_tokens * (1 + k % 3) // 3), "temperature": 0.8, "seed": k,
                  "stream": stream}
    if hang_up:
        body.update(max_tokens=max_tokens, ignore_eos=True)
    if k % 6 == 5:  # the completions endpoint, with the legacy logprobs
        path = "/v1/completions"
        body["prompt"] = (system if length == 2 else "") + user + "\nAnswer:"
        if k % 5 == 0:
            body["logprobs"] = 2
    else:
        path = "/v1/chat/completions"
        msgs = [{"role": "system", "content": system}] if length == 2 else []
        body["messages"] = msgs + [{"role": "user", "content": user}]
        if k % 5 == 0:
            body.update(logprobs=True, top_logprobs=2)
    if k % 3 == 0:
        body["stop"] = ["\n\n", " fox", "."] if k % 9 == 0 else ["\n\n"]
    if stream:
        body["stream_options"] = {"include_usage": True}
    return path, body, hang_up


async def _send(http, path: str, body: dict, hang_up: bool) -> dict:
    """One request: its completion tokens, and an error message if it failed."""
    got = {"tokens": 0, "error": None, "hung_up": False}
    if not body["stream"]:
        r = await http.post(path, json=body)
        if r.status_code != 200:
            got["error"] = f"HTTP {r.status_code}: {r.text[:200]}"
            return got
        data = r.json()
        if not data["choices"] or data["choices"][0]["finish_reason"] not in ("stop", "length"):
            got["error"] = f"bad reply: {json.dumps(data)[:200]}"
        got["tokens"] = data["usage"]["completion_tokens"]
        return got
    done, finish, chunks = False, None, 0
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            got["error"] = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
            return got
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                got["error"] = event["error"].get("message", str(event["error"]))
                return got
            if event.get("usage"):
                got["tokens"] = event["usage"]["completion_tokens"]
            for c in event.get("choices", ()):
                finish = c.get("finish_reason") or finish
                chunks += 1
            if hang_up and chunks >= 4:
                got.update(tokens=chunks - 1, hung_up=True)  # the role chunk carries no token
                return got  # leaving the block closes the connection mid-stream
    if not done or finish not in ("stop", "length"):
        got["error"] = f"stream ended without [DONE] or a finish reason (done {done}, finish {finish})"
    return got


async def _client(http, first_k: int, n: int, max_tokens: int, scale: float) -> list[dict]:
    out = []
    for k in range(first_k, first_k + n):
        try:
            out.append(await _send(http, *request_for(k, max_tokens, scale)))
        except Exception as e:  # a transport error is a failed request, not a failed round
            out.append({"tokens": 0, "error": f"{type(e).__name__}: {e}", "hung_up": False})
    return out


async def run_round(base: str, headers: dict, index: int, clients: int, per_client: int, max_tokens: int,
                    scale: float = 1.0) -> dict:
    """One round: `clients` concurrent clients, each sending `per_client` requests in turn."""
    import httpx

    per_round = clients * per_client
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, headers=headers, limits=limits, timeout=httpx.Timeout(300)) as http:
        t0 = time.perf_counter()
        results = await asyncio.gather(*[_client(http, index * per_round + c * per_client, per_client, max_tokens, scale)
                                         for c in range(clients)])
        wall = time.perf_counter() - t0
    flat = [r for rs in results for r in rs]
    errors = [r["error"] for r in flat if r["error"]]
    tokens = sum(r["tokens"] for r in flat)
    return {"requests": len(flat), "errors": len(errors), "error_samples": errors[:3],
            "hung_up": sum(r["hung_up"] for r in flat), "tokens": tokens, "wall_s": round(wall, 2),
            "tok_s": round(tokens / wall, 1)}
