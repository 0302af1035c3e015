"""n choices, logit_bias and stop with n, with the official `openai` client against a real
`ember serve` on Qwen2.5-Coder-0.5B-Instruct, both runners. The prompt of n choices is
computed once: the engine's own counters (/metrics) show the other choices reused its KV.
"""
from __future__ import annotations

import re

import httpx
import openai
import pytest
from real_models import QWEN_05B, fetch_parts_model
from server_util import qwen_server_fixtures

pytestmark = pytest.mark.slow
BLOCK = 16  # the engine's block size: a prompt's last partial block is recomputed per choice


server, client = qwen_server_fixtures(("llama.cpp", "torch"), 2048)


def _counters(server) -> dict[str, float]:
    text = httpx.get(server.base_url + "/metrics", headers={"Authorization": f"Bearer {server.api_key}"}).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(ember_\w+_total) ([0-9.e+]+)$", text, re.M)}


STORY = ("Once upon a time a lighthouse keeper counted ships. " * 12).strip()


def test_n_choices_compute_the_prompt_once(client, server):
    before = _counters(server)
    r = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": STORY + " Continue the story."}],
        n=3, temperature=1.0, seed=7, max_tokens=12)
    after = _counters(server)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in r.choices)
    assert len({c.message.content for c in r.choices}) > 1  # three draws, not one copied
    p = r.usage.prompt_tokens
    admitted = after["ember_prompt_tokens_total"] - before["ember_prompt_tokens_total"]
    reused = after["ember_prompt_cached_tokens_total"] - before["ember_prompt_cached_tokens_total"]
    assert admitted == 3 * p
    assert admitted - reused <= p + 2 * BLOCK, (p, admitted, reused)  # computed once (+ the tails)
    assert r.usage.completion_tokens <= 3 * 12


def test_n_streamed_and_stop(client):
    chunks = list(client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Count from 1 to 20, comma separated."}],
        n=2, temperature=0, max_tokens=60, stop=["7"], stream=True))
    texts = {0: "", 1: ""}
    reasons = {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
    assert reasons == {0: "stop", 1: "stop"}
    assert texts[0] == texts[1] and "7" not in texts[0] and "6" in texts[0]  # greedy: the same twice


def test_logit_bias_bans_and_forces(client):
    ask = [{"role": "user", "content": "Say hello."}]
    plain = client.chat.completions.create(model="default", messages=ask, temperature=0, max_tokens=1,
                                           logprobs=True)
    first = plain.choices[0].logprobs.content[0]
    tok = _token_id(first.token)
    banned = client.chat.completions.create(model="default", messages=ask, temperature=0, max_tokens=1,
                                            logit_bias={str(tok): -100})
    assert banned.choices[0].message.content != plain.choices[0].message.content
    x = _token_id("x")
    forced = client.chat.completions.create(model="default", messages=ask, temperature=0, max_tokens=3,
                                            logit_bias={str(x): 100})
    assert forced.choices[0].message.content == "xxx"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=ask, max_tokens=1, logit_bias={"abc": 1})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=ask, max_tokens=1, logit_bias={"10000000": 1})


def _token_id(text: str) -> int:
    from engine.loaders.tokenizer import Tokenizer

    ids = Tokenizer(fetch_parts_model(*QWEN_05B)).encode(text, add_bos=False, parse_special=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]
