"""The soaked server against a fresh one in paired rounds: is a server slower after a day's work?

One round's tok/s on these shared VMs swings 10-20% with the machine (the server's CPU time per
token swings with it: clock and neighbours, not Ember), so the soak's first round against its
last cannot show a 3% drift. This asks the question directly. A fresh server with the same
settings starts beside the soaked one and runs the soak's warm-up rounds (its caches fill as the
soaked one's did) and the soaked one runs one unscored round (it sat idle meanwhile: in two runs
the first pair after that idle read 0.91-0.93, the others 0.99-1.06); then both run the same
rounds in ABBA order (soaked, fresh; fresh, soaked; ...), so the machine's slow swings hit both
alike and each pair's ratio cancels them. Reported: the median and the range of the pairs'
soaked / fresh tok/s.
"""
from __future__ import annotations

import asyncio
import secrets
import statistics
from pathlib import Path

from app.bench.lib.readiness import engine_status, heap_trims, settle
from app.bench.soak_mix import run_round


def _round_on(http, server, index: int, args) -> float:
    base, headers = server
    trims = heap_trims(engine_status(http, base, headers))
    res = asyncio.run(run_round(base, headers, index, args.clients, args.per_client, args.max_tokens,
                                args.prompt_scale))
    settle(http, base, headers, trims)
    if res["errors"]:
        raise RuntimeError(f"paired round {index}: {res['errors']} errors, e.g. {res['error_samples'][:1]}")
    return res["tok_s"]


def compare_with_fresh(argv: list[str], http, soaked: tuple[str, dict], args, first_index: int,
                       log_path: Path) -> dict:
    """Median of args.ab_pairs paired rounds' soaked/fresh tok/s; rounds numbered from first_index
    (prompts neither server has seen)."""
    from app.engine_process import EngineProcess

    fresh_proc = EngineProcess(argv, api_key=secrets.token_urlsafe(16), log_path=log_path.with_suffix(".fresh.log"))
    with fresh_proc.start(timeout=600):
        fresh = (fresh_proc.base_url, fresh_proc.headers)
        settle(http, *fresh)
        for i in range(args.warmup):
            _round_on(http, fresh, i, args)
        _round_on(http, soaked, first_index, args)  # unscored: it sat idle through the fresh one's warm-up
        pairs = []
        for p in range(args.ab_pairs):
            index = first_index + 1 + p
            if p % 2 == 0:
                a, b = _round_on(http, soaked, index, args), _round_on(http, fresh, index, args)
            else:
                b, a = _round_on(http, fresh, index, args), _round_on(http, soaked, index, args)
            pairs.append((a, b))
            print(f"  pair {p}: soaked {a:.1f} tok/s, fresh {b:.1f} tok/s, ratio {a / b:.3f}", flush=True)
    ratios = [a / b for a, b in pairs if b]
    return {"pairs": pairs, "ratio_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3)}
