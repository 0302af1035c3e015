"""`ember bench kv`: how well the paged KV cache uses memory, on a realistic mix of chats.

The workload is N chats whose prompt and reply lengths are drawn (seeded) from log-normals
shaped like ShareGPT (means about 161 prompt and 338 reply tokens, as reported in the vLLM
paper; sigma 1, so a long tail of long chats), cut to the context length. Everything runs on
the real Scheduler and BlockManager; the "model" just replays each chat's scripted reply.

- waste: KV slots allocated but holding no token, over all steps of the run
  (1 - resident tokens / allocated slots). Paging only wastes the tail of each
  sequence's last block, so this stays near (B/2) / mean length.
- fit: chats of the workload, in order, whose final length (prompt + reply) fits a fixed
  KV budget at once, against one contiguous max-context cache per chat (what a runtime
  without paging must reserve, since the reply's length is unknown in advance).
- multi-turn: chats that go on, each prompt being the whole history, in the same budget:
  the share of prompt tokens the prefix cache serves instead of recomputing.
"""
from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

# ShareGPT as reported by Kwon et al. 2023 (vLLM), Fig. 11: mean input 161.31, mean output 337.99.
PROMPT_MEAN, REPLY_MEAN, SIGMA = 161.31, 337.99, 1.0


@dataclass(frozen=True, slots=True)
class Chat:
    prompt: list[int]
    reply: list[int]


def sample_workload(num_chats: int, seed: int, max_context: int, system_tokens: int = 0,
                    vocab: int = 32000) -> list[Chat]:
    """Log-normal lengths with the given means: mu = ln(mean) - sigma^2 / 2."""
    rng = random.Random(seed)
    system = [rng.randrange(vocab) for _ in range(system_tokens)]

    def draw(mean: float) -> int:
        return max(1, round(rng.lognormvariate(math.log(mean) - SIGMA ** 2 / 2, SIGMA)))

    chats = []
    for _ in range(num_chats):
        p = min(len(system) + draw(PROMPT_MEAN), max_context - 1)
        r = min(draw(REPLY_MEAN), max_context - p)
        chats.append(Chat(system[:p] + [rng.randrange(vocab) for _ in range(p - len(system))],
                          [rng.randrange(vocab) for _ in range(r)]))
    return chats


@dataclass(slots=True)
class KVReport:
    block_size: int
    waste: float  # allocated-but-empty slots / allocated slots, summed over steps
    peak_waste: float  # the same at the step with the most blocks in use
    steps: int
    prefix_hit_rate: float
    budget_tokens: int
    fit_paged: int
    fit_contiguous: int
    fit_reserve_max_tokens: int
    max_tokens_reserved: int
    turns: int = 0
    turn_chats: int = 0
    multiturn_hit_rate: float = 0.0  # prompt tokens served by the prefix cache
    multiturn_prompt_tokens: int = 0
    multiturn_preemptions: int = 0

    @property
    def fit_ratio(self) -> float:
        return self.fit_paged / max(1, self.fit_contiguous)


def measure_waste(chats: list[Chat], block_size: int, max_context: int) -> tuple[float, float, int, float]:
    """Run every chat through Scheduler + BlockManager with room for all; after each step,
    compare resident tokens with allocated slots. Shared prefix blocks are full, so resident
    tokens = sum(num_computed) - B * (table entries - distinct blocks)."""
    total_tokens = sum(len(c.prompt) + len(c.reply) for c in chats)
    bm = BlockManager(total_tokens // block_size + 2 * len(chats) + 1, block_size)
    config = EngineConfig(model_path="-", block_size=block_size, max_num_seqs=len(chats),
                          max_num_batched_tokens=2048, max_prefill_chunk=512, max_model_len=max_context)
    sched = Scheduler(config, bm)
    script = {}
    for i, chat in enumerate(chats):
        seq = Sequence(chat.prompt, SamplingParams(max_tokens=len(chat.reply)), seq_id=i, arrival_time=i)
        sched.add(seq)
        script[i] = chat.reply
    allocated = resident = steps = 0
    peak = (0, 0)
    while sched.has_unfinished():
        out = sched.schedule()
        tokens = [[script[s.seq_id][s.num_output_tokens]] for s in out.sampled_seqs()]
        sched.postprocess(out, tokens)
        for s in out.sampled_seqs():
            if s.num_output_tokens >= len(script[s.seq_id]):
                sched.finish(s)
        entries = sum(len(s.block_table) for s in sched.running)
        used = bm.num_used_blocks
        res = sum(s.num_computed_tokens for s in sched.running) - block_size * (entries - used)
        allocated += used * block_size
        resident += res
        peak = max(peak, (used * block_size, res))
        steps += 1
    assert bm.num_used_blocks == 0, "blocks leaked"
    return (1 - resident / allocated if allocated else 0.0, 1 - peak[1] / peak[0] if peak[0] else 0.0, steps,
            bm.prefix_hit_rate)


def count_fit(chats: list[Chat], budget_tokens: int, block_size: int) -> int:
    """Chats, in order, that the real BlockManager holds at their final length at once."""
    bm = BlockManager(budget_tokens // block_size, block_size)
    fit = 0
    for i, chat in enumerate(chats):
        seq = Sequence(chat.prompt + chat.reply, seq_id=i)
        if not bm.can_allocate(seq):
            break
        bm.allocate(seq)
        seq.num_computed_tokens = seq.num_tokens
        bm.hash_blocks(seq)  # a later chat may share this one's prefix
        fit += 1
    return fit


def measure_multiturn(num_chats: int, turns: int, seed: int, block_size: int, pool_tokens: int,
                      max_context: int, vocab: int = 32000) -> tuple[float, int, int]:
    """Chats that go on: each finished turn is followed by the user's next message, whose
    prompt is the whole history. In a pool of pool_tokens (LRU eviction), returns the share
    of prompt tokens served by the prefix cache, the prompt tokens, and the preemptions."""
    rng = random.Random(seed)
    bm = BlockManager(pool_tokens // block_size, block_size)
    config = EngineConfig(model_path="-", block_size=block_size, max_num_seqs=num_chats,
                          max_num_batched_tokens=2048, max_prefill_chunk=512, max_model_len=max_context)
    sched = Scheduler(config, bm)
    history: dict[int, list[int]] = {i: [] for i in range(num_chats)}
    owner: dict[int, tuple[int, list[int]]] = {}  # seq_id -> (chat, scripted reply)
    done = dict.fromkeys(history, 0)
    submitted = cached = 0

    def draw(mean: float) -> int:
        return max(1, round(rng.lognormvariate(math.log(mean) - SIGMA ** 2 / 2, SIGMA)))

    def submit(chat: int) -> None:
        nonlocal submitted
        prompt = history[chat] + [rng.randrange(vocab) for _ in range(draw(PROMPT_MEAN))]
        if len(prompt) >= max_context or len(prompt) > pool_tokens // 2:
            return  # the chat is full: the user starts a new one
        reply = [rng.randrange(vocab) for _ in range(min(draw(REPLY_MEAN), max_context - len(prompt)))]
        seq = Sequence(prompt, SamplingParams(max_tokens=len(reply)), seq_id=len(owner))
        owner[seq.seq_id] = (chat, reply)
        submitted += len(prompt)
        sched.add(seq)

    for chat in history:
        submit(chat)
    while sched.has_unfinished():
        out = sched.schedule()
        sched.postprocess(out, [[owner[s.seq_id][1][s.num_output_tokens]] for s in out.sampled_seqs()])
        for s in out.sampled_seqs():
            chat, reply = owner[s.seq_id]
            if s.num_output_tokens >= len(reply):
                cached += s.num_cached_tokens  # hits at admission (not a recompute's)
                sched.finish(s)
                history[chat] = list(s.token_ids)
                done[chat] += 1
                if done[chat] < turns:
                    submit(chat)
    return cached / submitted, submitted, sched.num_preemptions


def run_kv(num_chats=64, seed=0, block_size=16, max_context=4096, budget_contexts=4,
           max_tokens=1024, system_tokens=0, turns=4, turn_chats=16) -> KVReport:
    chats = sample_workload(num_chats, seed, max_context, system_tokens)
    waste, peak_waste, steps, hit_rate = measure_waste(chats, block_size, max_context)
    budget = budget_contexts * max_context
    reserve = 0  # contiguous prompt + max_tokens per chat, in order
    used = 0
    for chat in chats:
        need = min(len(chat.prompt) + max_tokens, max_context)
        if used + need > budget:
            break
        used += need
        reserve += 1
    mt = measure_multiturn(turn_chats, turns, seed, block_size, budget, max_context) if turns else (0.0, 0, 0)
    return KVReport(block_size, waste, peak_waste, steps, hit_rate, budget,
                    count_fit(chats, budget, block_size), budget // max_context, reserve, max_tokens,
                    turns, turn_chats, *mt)


def format_report(chats: list[Chat], reports: list[KVReport], max_context: int, seed: int) -> str:
    totals = sorted(len(c.prompt) + len(c.reply) for c in chats)
    prompts = sorted(len(c.prompt) for c in chats)
    replies = sorted(len(c.reply) for c in chats)

    def q(xs, f):
        return xs[min(len(xs) - 1, int(f * len(xs)))]

    lines = [
        f"ember bench kv: {len(chats)} chats, log-normal lengths (ShareGPT-like), seed {seed}, "
        f"context {max_context}",
        f"  prompt tokens  median {q(prompts, .5):>5}  p90 {q(prompts, .9):>5}  max {prompts[-1]:>5}",
        f"  reply tokens   median {q(replies, .5):>5}  p90 {q(replies, .9):>5}  max {replies[-1]:>5}",
        f"  chat length    mean {sum(totals) / len(totals):>7.1f}  max {totals[-1]:>5}",
        "",
        f"{'block size':>10} | {'wasted slots':>12} | {'at peak':>7} | {'fit in budget':>13} | "
        f"{'contig. max-ctx':>15} | {'ratio':>6} | {'contig. p+max_tok':>17} | goals",
        "-" * 108,
    ]
    for r in reports:
        lines.append(
            f"{r.block_size:>10} | {r.waste:>11.2%} | {r.peak_waste:>6.2%} | {r.fit_paged:>13} | "
            f"{r.fit_contiguous:>15} | {r.fit_ratio:>5.1f}x | {r.fit_reserve_max_tokens:>17} | "
            + ("met" if r.waste <= 0.04 and r.fit_ratio >= 3 else "missed"))
    r = reports[0]
    lines += [
        "",
        f"budget: {r.budget_tokens} KV tokens (= {r.fit_contiguous} max-context caches); "
        f"'contig. p+max_tok' reserves prompt + {r.max_tokens_reserved} tokens per chat.",
        "goals: wasted slots <= 4% (time-averaged), ratio >= 3x.",
    ]
    if r.turns:
        lines.append("")
        for x in reports:
            lines.append(
                f"multi-turn, block {x.block_size}: {x.turn_chats} chats x {x.turns} turns in the same budget: "
                f"{x.multiturn_hit_rate:.1%} of {x.multiturn_prompt_tokens} prompt tokens served by the "
                f"prefix cache, {x.multiturn_preemptions} preemptions")
    return "\n".join(lines)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text!r}")
    return value


def _non_negative(text: str) -> int:
    return 0 if text.strip() == "0" else _positive(text)


def _block_sizes(text: str) -> list[int]:
    return [_positive(b) for b in text.split(",")]


def run(args) -> int:
    sizes = args.block_size
    if args.max_context < 2 or args.system_tokens >= args.max_context:
        raise SystemExit("ember bench kv: --max-context must be at least 2 and exceed --system-tokens")
    chats = sample_workload(args.chats, args.seed, args.max_context, args.system_tokens)
    reports = [run_kv(args.chats, args.seed, b, args.max_context, args.budget_contexts,
                      args.max_tokens, args.system_tokens, args.turns, args.turn_chats) for b in sizes]
    if args.json:
        print(json.dumps([asdict(r) | {"fit_ratio": r.fit_ratio} for r in reports], indent=2))
    else:
        print(format_report(chats, reports, args.max_context, args.seed))
    return 0


def register(bench_sub) -> None:
    p = bench_sub.add_parser("kv", help="KV-cache memory: slots wasted, chats that fit vs contiguous caches")
    p.add_argument("--chats", type=_positive, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=_block_sizes, default=[16],
                   help="tokens per block; a list like 8,16,32 compares")
    p.add_argument("--max-context", type=_positive, default=4096)
    p.add_argument("--budget-contexts", type=_positive, default=4,
                   help="the fixed KV budget, in max-context caches")
    p.add_argument("--max-tokens", type=_positive, default=1024,
                   help="reply reservation of the prompt+max_tokens baseline")
    p.add_argument("--system-tokens", type=_non_negative, default=0,
                   help="a system prompt shared by every chat (exercises the prefix cache)")
    p.add_argument("--turns", type=_non_negative, default=4,
                   help="multi-turn part: turns per chat, each prompt = the whole history (0: skip)")
    p.add_argument("--turn-chats", type=_positive, default=16, help="multi-turn part: concurrent chats")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)
