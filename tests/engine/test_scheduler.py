"""Scheduler: token budget, chunked prefill, decodes first, preemption, priorities, abort.

The scheduler is torch-free, so it is driven here by a token-level stand-in for the model that
still goes through the paged pool: each computed position stores its token in the slot the block
table names, and a sampled token is a hash of the context READ BACK from the pool. Wrong block
tables, a bad prefix-cache hit, a lost copy or a broken recompute after preemption therefore
change the generated tokens, and every test can compare against each sequence run alone.
"""
from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.scheduler_output import SchedulerOutput
from engine.sequence import Sequence, SequenceStatus

VOCAB = 1000


class PoolModel:
    """Stands in for ModelRunner: the 'K/V' of a position is its token id, kept in the paged pool."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.B = block_size
        self.pool = [[None] * block_size for _ in range(num_blocks)]

    def execute(self, out: SchedulerOutput) -> list[list[int]]:
        for src, dst in out.block_copies:
            self.pool[dst] = list(self.pool[src])
        sampled = []
        for seq, n, is_sampled in zip(out.seqs, out.num_new_tokens, out.is_sampled):
            c, table = seq.num_computed_tokens, seq.block_table
            for p in range(c, c + n):
                self.pool[table[p // self.B]][p % self.B] = seq.token_ids[p]
            if is_sampled:
                context = [self.pool[table[p // self.B]][p % self.B] for p in range(c + n)]
                sampled.append([next_token(context)])
        return sampled


def next_token(context: list[int]) -> int:
    digest = hashlib.blake2b(repr(context).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VOCAB


def make(num_blocks=64, block_size=4, **kw) -> tuple[Scheduler, BlockManager, PoolModel]:
    cfg = EngineConfig(model_path="-", block_size=block_size, **kw)
    bm = BlockManager(num_blocks, block_size)
    return Scheduler(cfg, bm), bm, PoolModel(num_blocks, block_size)


def seq(prompt, max_tokens=8, priority=0, t=0.0, sid=None) -> Sequence:
    return Sequence(list(prompt), SamplingParams(max_tokens=max_tokens, priority=priority),
                    seq_id=sid, request_id=None, arrival_time=t)


def step(sched: Scheduler, model: PoolModel) -> SchedulerOutput:
    """One engine step: schedule, run, postprocess, finish sequences at max_tokens."""
    out = sched.schedule()
    sched.postprocess(out, model.execute(out))
    for s in out.sampled_seqs():
        if s.num_output_tokens >= s.max_tokens:
            sched.finish(s, SequenceStatus.FINISHED_LENGTH)
    sched.block_manager.check()
    return out


def run(sched, model, arrivals: dict[int, list[Sequence]], max_steps=10_000, check=None,
        aborts: dict[int, list[str]] | None = None) -> list[SchedulerOutput]:
    outs = []
    for i in range(max_steps):
        for s in arrivals.get(i, []):
            sched.add(s)
        for request_id in (aborts or {}).get(i, []):
            used = sched.block_manager.num_used_blocks
            victim = sched.abort(request_id)
            if victim is not None:
                assert victim.block_table == [] and sched.block_manager.num_used_blocks <= used
        if not sched.has_unfinished() and i > max(arrivals, default=0):
            return outs
        out = step(sched, model)
        if check:
            check(out)
        outs.append(out)
    raise AssertionError("the scheduler did not finish: it spins")


def alone(prompt: list[int], max_tokens: int) -> list[int]:
    """The oracle: the same sequence with the whole pool to itself, no chunking."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


# ---- the step ---------------------------------------------------------------------------------

def test_token_budget_seq_limit_and_chunk_size_hold_every_step():
    sched, bm, model = make(num_blocks=200, max_num_batched_tokens=40, max_num_seqs=5, max_prefill_chunk=16)
    rng = random.Random(0)
    seqs = [seq(prompt(rng, rng.randint(1, 70)), max_tokens=rng.randint(1, 12)) for _ in range(12)]

    def check(out):
        assert out.num_batched_tokens <= 40 and len(out.seqs) <= 5
        assert all(1 <= n <= 16 for n in out.num_new_tokens)
        assert sched.num_running <= 5

    run(sched, model, {0: seqs[:6], 3: seqs[6:]}, check=check)
    assert [s.output_token_ids for s in seqs] == [alone(s.prompt_token_ids, s.max_tokens) for s in seqs]
    assert bm.num_used_blocks == 0


def test_long_prompt_is_chunked_and_sampled_only_at_its_end():
    sched, _, model = make(max_num_batched_tokens=64, max_prefill_chunk=16)
    s = seq(range(50), max_tokens=3)
    sched.add(s)
    outs = [step(sched, model) for _ in range(4)]
    assert [o.num_new_tokens for o in outs] == [[16], [16], [16], [2]]
    assert [o.is_sampled for o in outs] == [[False], [False], [False], [True]]
    assert s.num_output_tokens == 1 and s.num_computed_tokens == 50


def test_decodes_come_first_and_a_long_prompt_delays_them_by_one_chunk_at_most():
    sched, _, model = make(num_blocks=400, max_num_batched_tokens=24, max_prefill_chunk=16)
    rng = random.Random(1)
    chats = [seq(prompt(rng, 5), max_tokens=40, t=i) for i in range(4)]
    for c in chats:
        sched.add(c)
    step(sched, model)  # all four prompts in one step (20 tokens)
    long = seq(prompt(rng, 300), max_tokens=2, t=10)
    sched.add(long)
    while long.num_output_tokens == 0:  # 19 chunks of at most 16 (the chats' decodes go first)
        before = [c.num_tokens for c in chats]
        out = step(sched, model)
        assert out.num_decodes == 4 and out.seqs[:4] == chats
        assert all(n == 1 for n in out.num_new_tokens[:4]) and all(n > 1 for n in out.num_new_tokens[4:])
        assert [c.num_tokens for c in chats] == [b + 1 for b in before]  # every chat advanced
        assert out.num_batched_tokens <= 24
        assert out.seqs[4:] == [long] and out.num_new_tokens[4] <= 16
    assert long.num_computed_tokens == 300


def test_decodes_get_the_budget_before_a_more_urgent_prefill():
    sched, _, model = make(num_blocks=400, max_num_batched_tokens=24, max_prefill_chunk=24)
    rng = random.Random(8)
    jobs = [seq(prompt(rng, 5), max_tokens=40, priority=1, t=i) for i in range(4)]
    for j in jobs:
        sched.add(j)
    step(sched, model)
    urgent = seq(prompt(rng, 100), max_tokens=1, priority=0, t=9)
    sched.add(urgent)
    while urgent.num_output_tokens == 0:
        out = step(sched, model)
        assert out.seqs[:4] == jobs and out.num_new_tokens == [1, 1, 1, 1, 20][:len(out.seqs)]


def test_staggered_arrivals_match_each_sequence_alone():
    sched, bm, model = make(num_blocks=120, max_num_batched_tokens=48, max_prefill_chunk=12, max_num_seqs=16)
    rng = random.Random(2)
    seqs = [seq(prompt(rng, rng.randint(1, 60)), max_tokens=rng.randint(1, 20), t=i) for i in range(16)]
    run(sched, model, {2 * i: [s] for i, s in enumerate(seqs)})
    assert [s.output_token_ids for s in seqs] == [alone(s.prompt_token_ids, s.max_tokens) for s in seqs]
    assert all(s.status == SequenceStatus.FINISHED_LENGTH for s in seqs)
    assert bm.num_used_blocks == 0 and bm.num_free_blocks == 120


def test_shared_system_prompt_hits_the_prefix_cache():
    sched, bm, model = make(num_blocks=200)
    rng = random.Random(3)
    system = prompt(rng, 37)
    first = seq(system + prompt(rng, 5), max_tokens=4)
    run(sched, model, {0: [first]})
    later = [seq(system + prompt(rng, rng.randint(1, 9)), max_tokens=4, t=i + 1) for i in range(5)]
    run(sched, model, {0: later})
    assert all(s.num_cached_tokens == 36 for s in later)  # 9 full blocks of the 37-token system prompt
    assert bm.prefix_hit_rate > 0.5
    assert [s.output_token_ids for s in later] == [alone(s.prompt_token_ids, 4) for s in later]


# ---- preemption -------------------------------------------------------------------------------

def test_preemption_takes_the_newest_and_it_resumes_first():
    # 12 blocks of 4: three 12-token prompts take 9; d (14 tokens) must wait; growth past 16
    # tokens needs a fifth block per sequence that is not there.
    sched, bm, model = make(num_blocks=12, max_num_batched_tokens=64, max_prefill_chunk=64)
    rng = random.Random(4)
    a, b, c = (seq(prompt(rng, 12), max_tokens=12, t=i, sid=100 + i) for i in range(3))
    d = seq(prompt(rng, 14), max_tokens=4, t=3, sid=103)
    for s in (a, b, c):
        sched.add(s)
    step(sched, model)
    sched.add(d)
    outs, victims = [], []
    while not victims:
        outs.append(step(sched, model))
        victims = outs[-1].preempted
    assert victims == [c]  # newest running; d never got in
    assert sched.waiting[0] is c and sched.waiting[1] is d  # at the front, ahead of later arrivals
    assert c.num_computed_tokens == 0 and c.block_table == [] and c.num_output_tokens > 0
    assert c.num_cached_tokens == 0  # the prompt's own hits; a recompute's hits are not usage
    while c.status != SequenceStatus.RUNNING:
        out = step(sched, model)
        if d.status == SequenceStatus.RUNNING:  # c resumes first (maybe in the same step)
            assert c.status == SequenceStatus.RUNNING and out.seqs.index(c) < out.seqs.index(d)
    run(sched, model, {})
    assert sched.num_preemptions >= 1 and c.num_cached_tokens == 0 and c.num_preemptions == 1
    assert [s.output_token_ids for s in (a, b, c, d)] == [alone(s.prompt_token_ids, s.max_tokens) for s in (a, b, c, d)]


def test_preemption_victim_is_lowest_priority_before_newest():
    sched, _, model = make(num_blocks=12, max_num_batched_tokens=64, max_prefill_chunk=64)
    rng = random.Random(5)
    background = seq(prompt(rng, 12), max_tokens=12, priority=1, t=0)
    chats = [seq(prompt(rng, 12), max_tokens=12, priority=0, t=1 + i) for i in range(2)]
    for s in (background, *chats):
        sched.add(s)
    victims = []
    while not victims:
        victims = step(sched, model).preempted
    assert victims == [background]
    run(sched, model, {})
    assert [s.output_token_ids for s in (background, *chats)] == [
        alone(s.prompt_token_ids, 12) for s in (background, *chats)]


def test_interactive_chat_goes_ahead_of_queued_background_jobs():
    sched, _, model = make(num_blocks=100, max_num_seqs=2)
    rng = random.Random(6)
    jobs = [seq(prompt(rng, 6), max_tokens=30, priority=1, t=i) for i in range(3)]
    chat = seq(prompt(rng, 6), max_tokens=3, priority=0, t=10)
    for j in jobs:
        sched.add(j)
    step(sched, model)
    assert sched.num_running == 2 and sched.waiting == [jobs[2]]
    sched.add(chat)
    assert sched.waiting == [chat, jobs[2]]  # ordered by (priority, arrival)
    out = step(sched, model)
    assert chat in out.seqs and out.preempted == [jobs[1]]  # the seq limit made room by priority
    victim = jobs[1]
    while victim.status != SequenceStatus.RUNNING:
        known = victim.num_tokens
        out = step(sched, model)
    # Its freed blocks kept their hashes, so the recompute starts after its full blocks.
    assert out.num_new_tokens[out.seqs.index(victim)] == known - (known - 1) // 4 * 4
    run(sched, model, {})
    assert chat.output_token_ids == alone(chat.prompt_token_ids, 3)
    assert all(j.output_token_ids == alone(j.prompt_token_ids, 30) for j in jobs)


# ---- background work (a warm: a chat's prompt into the prefix cache, engine/server/warm.py) -----

def warm(prompt_ids, t=0.0) -> Sequence:
    return Sequence(list(prompt_ids), SamplingParams(max_tokens=1, background=True), arrival_time=t)


def test_a_warm_runs_only_in_steps_without_a_request_and_leaves_its_blocks_cached():
    sched, bm, model = make(num_blocks=100, max_num_batched_tokens=64, max_prefill_chunk=16)
    rng = random.Random(11)
    w, chat = warm(prompt(rng, 50)), seq(prompt(rng, 10), max_tokens=6, priority=10, t=1)
    outs = run(sched, model, {0: [w], 1: [chat]})
    last = max(i for i, out in enumerate(outs) if chat in out.seqs)
    # from the chat's arrival to its last token (whatever its priority) the warm got no step
    assert w in outs[0].seqs and not any(w in out.seqs for out in outs[1:last + 1])
    assert chat.output_token_ids == alone(chat.prompt_token_ids, 6)
    assert w.status.is_finished and w.num_preemptions == 0
    turn = seq(w.prompt_token_ids + prompt(rng, 7), max_tokens=3, t=2)
    run(sched, model, {0: [turn]})
    assert turn.num_cached_tokens == 48  # the warm's 12 full blocks
    assert turn.output_token_ids == alone(turn.prompt_token_ids, 3)


def test_a_warm_is_preempted_for_a_request_that_needs_its_blocks():
    sched, bm, model = make(num_blocks=8, max_num_batched_tokens=64, max_prefill_chunk=16)
    rng = random.Random(12)
    w, chat = warm(prompt(rng, 28)), seq(prompt(rng, 20), max_tokens=4, t=1)
    sched.add(w)
    step(sched, model)  # the warm holds 4 of the 8 blocks
    sched.add(chat)  # it needs 6 in all
    victims = []
    while not victims:
        out = step(sched, model)
        victims = out.preempted
        assert w not in out.seqs
    assert victims == [w] and chat in out.seqs
    run(sched, model, {})
    assert chat.output_token_ids == alone(chat.prompt_token_ids, 4) and chat.num_preemptions == 0
    assert w.status.is_finished and w.num_preemptions == 1


def test_priority_never_preempts_in_vain():
    sched, _, model = make(num_blocks=6, max_num_batched_tokens=64, max_prefill_chunk=64)
    job = seq(range(8), max_tokens=2, priority=1)  # 2 blocks
    sched.add(job)
    step(sched, model)
    sched.add(seq(range(100, 124), max_tokens=1, priority=0))  # 24 tokens = all 6 blocks
    assert sched.schedule().preempted == [job]  # 4 free + 2 from the job: enough
    sched2, _, model2 = make(num_blocks=6, max_num_batched_tokens=64, max_prefill_chunk=64)
    a = seq(range(8), max_tokens=2, priority=0)
    job2 = seq(range(50, 54), max_tokens=2, priority=1)
    for s in (a, job2):
        sched2.add(s)
    step(sched2, model2)
    sched2.add(seq(range(100, 124), max_tokens=1, priority=0))  # needs 6: a holds 2 of them
    assert sched2.schedule().preempted == []  # preempting job2 alone would not be enough


def test_tiny_pool_under_heavy_preemption_still_matches_alone():
    sched, bm, model = make(num_blocks=10, block_size=4, max_num_batched_tokens=32, max_prefill_chunk=8)
    rng = random.Random(7)
    seqs = [seq(prompt(rng, rng.randint(1, 20)), max_tokens=rng.randint(1, 18), priority=rng.randint(0, 1), t=i)
            for i in range(16)]
    run(sched, model, {i: [s] for i, s in enumerate(seqs)})
    assert sched.num_preemptions > 0
    assert [s.output_token_ids for s in seqs] == [alone(s.prompt_token_ids, s.max_tokens) for s in seqs]
    assert bm.num_used_blocks == 0


# ---- abort, rejection ---------------------------------------------------------------------------

def test_abort_frees_blocks_at_once_wherever_the_sequence_is():
    sched, bm, model = make(num_blocks=40, max_num_seqs=1)
    running, waiting = seq(range(30), max_tokens=50), seq(range(40, 50), max_tokens=5)
    sched.add(running)
    sched.add(waiting)
    step(sched, model)
    assert bm.num_used_blocks == 8 and sched.num_waiting == 1
    assert sched.abort(running.request_id) is running
    assert bm.num_used_blocks == 0 and running.status == SequenceStatus.FINISHED_ABORTED
    assert sched.abort(waiting.request_id) is waiting and sched.num_waiting == 0
    assert sched.abort("no-such-request") is None
    assert not sched.has_unfinished()


def test_abort_between_schedule_and_postprocess_keeps_the_others_aligned():
    sched, bm, model = make()
    a, b, c = seq(range(5), max_tokens=5, t=0), seq(range(10, 15), max_tokens=5, t=1), seq(range(20, 25), max_tokens=5, t=2)
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()
    tokens = model.execute(out)
    sched.abort(b.request_id)
    sched.postprocess(out, tokens)
    assert a.output_token_ids == alone(a.prompt_token_ids, 1)
    assert c.output_token_ids == alone(c.prompt_token_ids, 1)
    assert b.num_output_tokens == 0 and b.block_table == []
    run(sched, model, {})
    assert c.output_token_ids == alone(c.prompt_token_ids, 5)


def test_a_prompt_that_can_never_fit_is_rejected_clearly():
    sched, _, _ = make(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="17 tokens.*holds only 16"):
        sched.add(seq(range(17)))
    assert not sched.has_unfinished()
    sched2, _, _ = make(num_blocks=64, max_model_len=32)
    with pytest.raises(ValueError, match="context"):
        sched2.add(seq(range(32)))


def test_max_tokens_is_capped_so_a_lone_sequence_never_spins():
    sched, bm, model = make(num_blocks=4, block_size=4)
    s = seq(range(10), max_tokens=1000)
    sched.add(s)
    assert s.max_tokens == 7  # 10 + 7 - 1 = 16 slots: the whole pool
    run(sched, model, {}, max_steps=50)
    assert s.output_token_ids == alone(list(range(10)), 7)


def test_a_sequence_grown_past_the_pool_is_finished_not_spun():
    """If the caller ignores seq.max_tokens, the scheduler ends the sequence itself."""
    sched, bm, model = make(num_blocks=2, block_size=4)
    s = seq(range(5), max_tokens=2)
    sched.add(s)
    s.max_tokens = 100  # bypass the cap
    finished = []
    for _ in range(20):
        out = step(sched, model)
        finished += out.finished
        if not sched.has_unfinished():
            break
    assert finished == [s] and s.status == SequenceStatus.FINISHED_LENGTH
    assert s.num_computed_tokens == 0 and bm.num_used_blocks == 0


# ---- random workloads -------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), num_blocks=st.integers(6, 40), block_size=st.sampled_from([1, 2, 4, 8]),
       budget=st.integers(1, 48), chunk=st.integers(1, 24), max_seqs=st.integers(1, 8))
def test_random_workloads_keep_limits_and_match_alone(data, num_blocks, block_size, budget, chunk, max_seqs):
    sched, bm, model = make(num_blocks=num_blocks, block_size=block_size, max_num_batched_tokens=budget,
                            max_prefill_chunk=chunk, max_num_seqs=max_seqs)
    shared = data.draw(st.lists(st.integers(0, VOCAB - 1), max_size=12))
    arrivals: dict[int, list[Sequence]] = {}
    seqs = []
    for i in range(data.draw(st.integers(1, 10))):
        own = data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=14))
        p = (shared + own)[: num_blocks * block_size]
        s = seq(p, max_tokens=data.draw(st.integers(1, 12)), priority=data.draw(st.integers(0, 2)), t=i)
        arrivals.setdefault(data.draw(st.integers(0, 6)), []).append(s)
        seqs.append(s)

    def check(out):
        assert out.num_batched_tokens <= budget and len(out.seqs) <= max_seqs
        assert all(1 <= n <= chunk for n in out.num_new_tokens)
        assert all(n == 1 for n in out.num_new_tokens[:out.num_decodes])
        assert all(n > 1 for n in out.num_new_tokens[out.num_decodes:])
        refs = sum(len(s.block_table) for s in sched.running)
        assert refs == sum(b.ref_count for b in bm.blocks)

    aborted = data.draw(st.sets(st.integers(0, len(seqs) - 1), max_size=3))
    aborts: dict[int, list[str]] = {}
    for i in aborted:
        aborts.setdefault(data.draw(st.integers(0, 12)), []).append(seqs[i].request_id)
    run(sched, model, arrivals, max_steps=3000, check=check, aborts=aborts)
    for i, s in enumerate(seqs):
        expected = alone(s.prompt_token_ids, s.max_tokens)
        if s.status == SequenceStatus.FINISHED_ABORTED:
            assert i in aborted and s.output_token_ids == expected[:s.num_output_tokens]
        else:
            assert s.output_token_ids == expected
    assert bm.num_used_blocks == 0 and not sched.requests
