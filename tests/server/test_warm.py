"""Warming a chat (`POST /v1/engine/warm`, engine/server/warm.py) through the real engine process:
after a restart the warm reads the chat's prefix back from the disk tier, and the next turn's
usage says its prompt came from the cache; a warm sent while a chat streams leaves that chat's
greedy tokens as they were alone."""
from __future__ import annotations

import re
import threading

import httpx
from server_util import LONG_CTX, long_max_tokens, openai_client, start_engine, tiny_model

BLOCK = 16  # the engine's block size
HISTORY = [{"role": "system", "content": "You are a careful assistant. " * 12},
           {"role": "user", "content": "The quick brown fox jumps over the lazy dog. What jumps?"}]


def _warm(proc, messages) -> dict:
    r = httpx.post(proc.base_url + "/v1/engine/warm", json={"model": "model", "messages": messages},
                   headers={"Authorization": f"Bearer {proc.api_key}"}, timeout=300)
    r.raise_for_status()
    return r.json()


def test_a_warmed_chat_after_a_restart_starts_its_next_turn_from_the_cache(tiny_model_factory, tmp_path):
    model, disk = tiny_model(tiny_model_factory), tmp_path / "kv-cache"
    with start_engine(model, tmp_path, "--kv-disk-dir", str(disk)) as proc:
        r = openai_client(proc).chat.completions.create(model="model", messages=HISTORY, max_tokens=8, temperature=0)
    chat = HISTORY + [{"role": "assistant", "content": r.choices[0].message.content}]
    with start_engine(model, tmp_path, "--kv-disk-dir", str(disk)) as proc:
        warm = _warm(proc, chat)
        assert warm["object"] == "engine.warm" and warm["prompt_tokens"] > r.usage.prompt_tokens
        assert warm["cached_tokens"] >= BLOCK  # the first turn's blocks, read back from disk
        metrics = httpx.get(proc.base_url + "/metrics", headers={"Authorization": f"Bearer {proc.api_key}"}).text
        assert re.search(r"^ember_prompt_tokens_total 0(\.0)?$", metrics, re.M)  # a warm is no request
        turn = chat + [{"role": "user", "content": "And what does the dog do?"}]
        again = openai_client(proc).chat.completions.create(model="model", messages=turn, max_tokens=4,
                                                            temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens == warm["prompt_tokens"] // BLOCK * BLOCK


def test_a_warm_sent_while_a_chat_streams_leaves_its_tokens_as_they_were(tiny_model_factory, tmp_path):
    model = tiny_model_factory(ctx=LONG_CTX)
    with start_engine(model, tmp_path) as proc:
        client = openai_client(proc)
        n = long_max_tokens(proc.base_url, proc.api_key, seconds=4)
        ask = dict(model="model", messages=HISTORY, max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
        alone = client.chat.completions.create(**ask).choices[0].message.content
        other = [{"role": "user", "content": "Tell me about lighthouses. " * 30}]
        warmed: list[dict] = []
        text, warmer = "", threading.Thread(target=lambda: warmed.append(_warm(proc, other)))
        for chunk in client.chat.completions.create(**ask, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                if not warmer.is_alive() and not warmed:
                    warmer.start()  # while the chat is running
                text += chunk.choices[0].delta.content
        warmer.join(timeout=300)
    assert text == alone
    assert warmed and warmed[0]["prompt_tokens"] > 100 and warmed[0]["cached_tokens"] == 0


def test_a_warm_on_the_llamacpp_runner_leaves_its_slot_for_the_next_turn(tiny_model_factory, tmp_path):
    chat = HISTORY + [{"role": "assistant", "content": "The fox does, over the dog."}]
    with start_engine(tiny_model(tiny_model_factory), tmp_path, backend="llama.cpp") as proc:
        warm = _warm(proc, chat)
        turn = chat + [{"role": "user", "content": "And the dog?"}]
        r = openai_client(proc).chat.completions.create(model="model", messages=turn, max_tokens=4, temperature=0)
    assert warm["cached_tokens"] == 0 and r.usage.prompt_tokens_details.cached_tokens == warm["prompt_tokens"]
