"""`ember bench kv`: the waste figure is computed right, and the default workload meets the goals."""
from __future__ import annotations

import json

import pytest

from app.bench.kv import Chat, count_fit, measure_waste, run_kv, sample_workload


def test_waste_matches_a_hand_count():
    # B=4, prompt 10, reply 5. After each step (resident / allocated): prefill 10/12, decodes
    # 11/12, 12/12, 13/16; the 5th reply token finishes the chat and frees it.
    waste, peak, steps, _ = measure_waste([Chat(list(range(10)), [7] * 5)], 4, 4096)
    assert steps == 5
    assert waste == pytest.approx(1 - (10 + 11 + 12 + 13) / (12 + 12 + 12 + 16))
    assert peak == pytest.approx(1 - 13 / 16)


def test_count_fit_uses_blocks_not_contexts():
    chats = [Chat(list(range(i * 100, i * 100 + 7)), [1] * 2) for i in range(10)]  # 9 tokens: 3 blocks of 4
    assert count_fit(chats, budget_tokens=40, block_size=4) == 3  # 10 blocks hold 3 chats of 3 blocks


def test_workload_is_seeded_and_within_context():
    a, b = sample_workload(64, 3, 512), sample_workload(64, 3, 512)
    assert a == b and a != sample_workload(64, 4, 512)
    assert all(1 <= len(c.prompt) and len(c.prompt) + len(c.reply) <= 512 for c in a)


def test_default_workload_meets_the_goals():
    r = run_kv(num_chats=64, seed=0, block_size=16, max_context=4096, budget_contexts=4)
    assert r.waste <= 0.04
    assert r.fit_ratio >= 3
    assert r.fit_paged > r.fit_reserve_max_tokens >= r.fit_contiguous


def test_cli_prints_json(capsys):
    from app.cli import main

    assert main(["bench", "kv", "--chats", "8", "--block-size", "8,16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["block_size"] for r in rows] == [8, 16]


def test_multiturn_chats_resume_from_the_prefix_cache():
    from app.bench.kv import measure_multiturn

    assert measure_multiturn(4, 1, 0, 16, 1 << 16, 4096)[0] == 0.0  # first turns share nothing
    rate, prompt_tokens, preemptions = measure_multiturn(4, 3, 0, 16, 1 << 16, 4096)
    assert preemptions == 0 and prompt_tokens > 0
    assert rate > 0.5  # later turns re-read their whole history from the cache
