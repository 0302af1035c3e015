"""The llama.cpp runner's prompt cache on disk: after a restart (a new engine on the same folder)
the next turn of a chat starts from the slot state the first engine saved, and the greedy reply
is the one an engine without any cache gives; a bad state file is refused and recomputed."""
from __future__ import annotations

import random

import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from engine.kv_disk.block_file import HEADER  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from test_llamacpp_engine import make_engine  # noqa: E402

B = 4
GREEDY = dict(temperature=0.0, ignore_eos=True)


def _turns(engine):
    rng = random.Random(3)
    turn1 = [rng.randrange(3, 200) for _ in range(41)]
    reply = engine.generate([turn1], SamplingParams(max_tokens=12, **GREEDY))[0].output_token_ids
    return turn1, turn1 + reply + [rng.randrange(3, 200) for _ in range(9)]


def _reply(engine, prompt):
    out = engine.generate([prompt], SamplingParams(max_tokens=12, **GREEDY))[0]
    engine.close()
    return out.output_token_ids, out.num_cached_tokens


@pytest.mark.parametrize("damage", [None, "flip"])
def test_next_turn_after_a_restart_reads_the_slot_from_disk(tiny_model_factory, tmp_path, damage):
    path = tiny_model_factory(n_heads=4, n_kv_heads=2)
    first = make_engine(path, block_size=B, kv_disk_dir=str(tmp_path))
    turn1, turn2 = _turns(first)
    first.close()  # the idle slot's state was written: 41 prompt + 11 reply cells, 52 = 13 blocks
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    alias, state = sorted(folder.glob("*.kv"), key=lambda f: f.stat().st_size)  # the prompt's 10 blocks name it
    assert alias.stat().st_size < HEADER.size + 64 < state.stat().st_size
    if damage:
        data = bytearray(state.read_bytes())
        data[HEADER.size + 100] ^= 0x40
        state.write_bytes(bytes(data))
    tokens, cached = _reply(make_engine(path, block_size=B, kv_disk_dir=str(tmp_path)), turn2)
    cold, _ = _reply(make_engine(path, block_size=B, enable_prefix_caching=False), turn2)
    assert tokens == cold
    assert cached == (0 if damage else 52)


def test_a_turn_that_departs_inside_the_reply_reads_the_prompts_blocks(tiny_model_factory, tmp_path):
    """Regenerate after a restart: the new prompt holds the first prompt but not its reply. The
    saved state is keyed by all its blocks (13); the prompt's own 10 lead to it as well."""
    path = tiny_model_factory(n_heads=4, n_kv_heads=2)
    first = make_engine(path, block_size=B, kv_disk_dir=str(tmp_path))
    turn1, _ = _turns(first)
    first.close()
    again = turn1 + [7, 8, 9]  # the same prompt, then other tokens where the reply was
    tokens, cached = _reply(make_engine(path, block_size=B, kv_disk_dir=str(tmp_path)), again)
    cold, _ = _reply(make_engine(path, block_size=B, enable_prefix_caching=False), again)
    assert tokens == cold
    assert cached == 40  # 41 prompt tokens: 10 full blocks
