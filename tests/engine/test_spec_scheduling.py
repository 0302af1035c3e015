"""How the scheduler schedules drafts (engine/scheduler.py) and takes back rejected ones."""
from __future__ import annotations

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence


def make(num_blocks=64, budget=1024, block_size=4):
    cfg = EngineConfig(model_path="-", block_size=block_size, max_num_batched_tokens=budget, max_model_len=256)
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(cfg, bm), bm


def decoding(sched, prompt, max_tokens=32):
    """A sequence past its prefill, one sampled token not yet computed (the others decode a token too)."""
    seq = Sequence(list(prompt), SamplingParams(max_tokens=max_tokens))
    sched.add(seq)
    out = sched.schedule()
    sched.postprocess(out, [[99] for _ in out.sampled_seqs()])
    return seq


def test_drafts_follow_the_last_token_and_the_accepted_prefix_stays():
    sched, bm = make()
    seq = decoding(sched, range(10))  # 11 tokens, 10 computed
    seq.spec_token_ids = [1, 2, 3, 4]
    out = sched.schedule()
    assert out.num_new_tokens == [5] and out.num_spec_tokens == [4] and out.num_logits == [5]
    assert seq.new_token_ids(5) == [99, 1, 2, 3, 4]
    assert len(seq.block_table) == 4  # 15 slots of 4 tokens
    sched.postprocess(out, [[1, 2, 7]])  # two drafts accepted, then the target's own token
    assert seq.token_ids[10:] == [99, 1, 2, 7] and seq.num_computed_tokens == 13
    assert seq.spec_token_ids == [] and (seq.num_spec_proposed, seq.num_spec_accepted) == (4, 2)
    assert len(seq.block_table) == 4  # 14 tokens: the fourth block still holds the next one
    bm.check()


def test_blocks_that_held_only_rejected_drafts_go_back():
    sched, bm = make()
    seq = decoding(sched, range(7))  # 8 tokens, 7 computed
    seq.spec_token_ids = [1, 2, 3, 4, 5, 6]
    out = sched.schedule()
    assert len(seq.block_table) == 4  # positions 7..13
    free = bm.num_free_blocks
    sched.postprocess(out, [[8]])  # the first draft rejected
    assert len(seq.block_table) == 3 and bm.num_free_blocks == free + 1  # 9 tokens: 3 blocks
    bm.check()


def test_drafts_stop_at_max_tokens_the_budget_and_other_decodes():
    sched, _ = make()
    a = decoding(sched, range(10), max_tokens=3)  # two output tokens so far: room for one more
    b = decoding(sched, range(20, 30))
    sched.max_num_batched_tokens = 6
    a.spec_token_ids, b.spec_token_ids = [1] * 8, [2] * 8
    out = sched.schedule()
    d = dict(zip([s.seq_id for s in out.seqs], out.num_spec_tokens))
    assert d[a.seq_id] == 0  # max_tokens 3 and 2 out: its last token yields the third, no room for drafts
    assert d[b.seq_id] == 4 and out.num_batched_tokens == 6  # the budget, after a's one token
    assert a.spec_token_ids == [] and len(b.spec_token_ids) == 4  # what the runner verifies


def test_drafts_never_preempt_anyone():
    sched, bm = make(num_blocks=6)
    a = decoding(sched, range(8))  # 9 tokens: 3 blocks
    b = decoding(sched, range(20, 31))  # a decodes one more; b's 12 tokens take the other 3 blocks
    assert bm.num_free_blocks == 0
    a.spec_token_ids = [1, 2, 3, 4]
    out = sched.schedule()
    assert set(out.seqs) == {a, b} and out.num_spec_tokens == [0, 0] and not out.preempted
    assert a.spec_token_ids == []
