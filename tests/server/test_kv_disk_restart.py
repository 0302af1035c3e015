"""The disk tier through the real engine process: `serve --kv-disk-dir`, a chat, the engine
stopped and started again, the same chat: its prompt comes from disk (usage says so) and the
greedy reply is the same."""
from __future__ import annotations

from server_util import openai_client, start_engine, tiny_model

MESSAGES = [{"role": "system", "content": "You are a careful assistant. " * 12},
            {"role": "user", "content": "The quick brown fox jumps over the lazy dog. What jumps?"}]


def _ask(model, tmp_path, disk):
    with start_engine(model, tmp_path, "--kv-disk-dir", str(disk)) as proc:
        r = openai_client(proc).chat.completions.create(model="model", messages=MESSAGES, max_tokens=8,
                                                        temperature=0)
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def test_a_restarted_engine_reads_the_chat_from_disk(tiny_model_factory, tmp_path):
    model, disk = tiny_model(tiny_model_factory), tmp_path / "kv-cache"
    first, cached, prompt_tokens = _ask(model, tmp_path, disk)
    assert cached == 0 and list(disk.glob("*/*.kv"))
    again, cached, _ = _ask(model, tmp_path, disk)
    assert again == first
    assert cached == (prompt_tokens - 1) // 16 * 16  # every full block but the one the last token is in
