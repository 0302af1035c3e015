"""`ember bench soak-gui`: does a long session of chats leave the desktop app's process bigger?

The server soak (soak.py) watches the engine; this watches the other process a user keeps open
all day. It builds the real app in this process (app.gui_main.build_app: window, tray, chat
store on SQLite, the engine controller) on a real engine process, and runs `--rounds` rounds
of what a user does: open `--chats` new chats and send each a message (replies stream into all
of them at once: plain text, code that gets highlighted, other languages), click from chat to
chat while they stream, stop one reply midway, regenerate one, then delete all but the
`--keep` newest chats. After each round it lets Qt delete what was scheduled, collects garbage
and prints the process's RSS, glibc's in-use and free bytes, Python's allocated blocks, the
number of QObjects under the window and live counts of the classes a chat creates (a deleted
chat still counted is a leak). At the end: RSS growth per 1,000 replies after `--warmup`
rounds (least-squares slope) and the live counts, judged against `--max-growth-mb`.

It runs under Qt's offscreen platform unless QT_QPA_PLATFORM says otherwise (a display works too).
"""
from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from app.bench.lib.stats import slope

MiB = 1 << 20
# what one chat makes on the GUI side, by class name (ui/ and the reply's worker)
WATCHED = ("ChatView", "TranscriptView", "TranscriptMessage", "MessageInput", "ReplyStream",
           "GeneratorWorker", "FunctionWorker", "WorkerSignals", "CodeBlock")
PROMPTS = ("Tell me about a lighthouse keeper in three sentences.",
           "Write a Python function that reverses the words of a sentence, in a code block.",
           "Écris deux phrases sur une rivière au printemps.",
           "用两句话介绍一下长城。",
           "List five things to pack for a night train, as a markdown list.",
           "Erzähl mir kurz von einer Stadt, die Boote baut.")


def register(bench_sub) -> None:
    p = bench_sub.add_parser("soak-gui", help="the desktop app's memory over many rounds of streaming chats")
    p.add_argument("--backend", choices=("torch", "llama.cpp"), default="torch")
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--chats", type=int, default=8, help="new chats per round, their replies streaming at once")
    p.add_argument("--keep", type=int, default=6, help="chats left open after each round (the rest are deleted)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--warmup", type=int, default=3, help="rounds left out of the growth figure")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-growth-mb", type=float, default=5.0, help="goal: RSS growth per 1,000 replies")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python's allocations (slow) and print what grew")
    p.add_argument("--json", dest="json_out", default=None, help="also write every round's figures here")
    p.set_defaults(func=run)


def count_qobjects(window) -> int:
    """The QObjects under the window. Only after the warm-up and at the end: every findChildren()
    call wraps each child for Python, and wrappers of children Qt later deletes stay behind
    (measured: ~9 Python blocks a reply when counted every round, none without)."""
    from PySide6.QtCore import QObject

    return len(window.findChildren(QObject))


def _wait(qapp, done, timeout: float, what: str) -> None:
    """Run the event loop until done() (as the app's exec() would), or fail naming what hung."""
    from PySide6.QtCore import QEventLoop

    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        qapp.processEvents(QEventLoop.AllEvents, 20)
        time.sleep(0.002)


def _settle(qapp) -> None:
    """Deliver deleteLater()s and pending signals, then collect: what is left is held by something."""
    from PySide6.QtCore import QCoreApplication, QEvent

    for _ in range(3):
        qapp.processEvents()
        QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    gc.collect()


def one_round(qapp, ember, i: int, args) -> dict:
    """Open args.chats chats, stream a reply into each while switching between them, stop the
    first once it has begun, regenerate the last, delete all but the newest args.keep chats."""
    window, store = ember.window, ember.chat_store
    views, finished = [], Counter()
    for j in range(args.chats):
        view = window.new_chat()
        # the first chat's reply is the long one the user stops once it has begun
        store.update_chat_settings(view.chat_id, {"max_tokens": args.max_tokens * (8 if j == 0 else 1),
                                                  "temperature": 0.8, "seed": i * 1000 + j})
        view.reply_finished.connect(lambda _cid, status: finished.update([status]))
        views.append(view)
    for j, view in enumerate(views):
        view.send(f"{PROMPTS[(i + j) % len(PROMPTS)]} (round {i}, chat {j})")
    to_stop = views[0]

    def begun() -> bool:
        return to_stop is not None and to_stop.is_streaming and bool(to_stop.transcript.messages[-1].content)

    t0, k = time.monotonic(), 0
    while sum(finished.values()) < len(views):  # about 10 clicks a second
        window.open_chat(views[k % len(views)].chat_id)  # the user clicks through the chats
        k += 1
        until = time.monotonic() + 0.1
        _wait(qapp, lambda: time.monotonic() > until or begun(), 10, "")
        if begun():
            to_stop.stop()
            to_stop = None
        if time.monotonic() - t0 > 600:
            raise TimeoutError(f"round {i}: {len(views) - sum(finished.values())} replies still streaming")
    replies = len(views)
    views[-1].regenerate()
    _wait(qapp, lambda: sum(finished.values()) > replies, 600, f"round {i}: the regenerated reply")
    errors = finished.get("error", 0)
    ids = [row.id for row in store.list_chats()]
    for chat_id in sorted(ids)[:-args.keep] if args.keep else ids:
        window.chat_list.delete(chat_id)
    return {"replies": replies + 1, "errors": errors, "stopped": finished.get("stopped", 0),
            "seconds": round(time.monotonic() - t0, 1)}


def start_app(args):
    """The real app (window, tray, chat store, engine controller) in a fresh data directory,
    once its engine is ready and the model list is in: (QApplication, the app)."""
    from PySide6.QtWidgets import QApplication

    from app.gui_main import build_app
    from app.settings import Settings
    from app.supervisor import SupervisorState

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    qapp = QApplication.instance() or QApplication([sys.argv[0]])
    root = Path(tempfile.mkdtemp(prefix="ember-soak-gui-"))
    settings = Settings(data_dir=root / "data", server_port=0, backend=args.backend, threads=args.threads)
    ember = build_app(settings)
    ember.window.show()
    ember.controller.start()
    sup = ember.controller.supervisor
    _wait(qapp, lambda: sup.state in (SupervisorState.READY, SupervisorState.ERROR), 600, "the engine's start")
    if sup.state is not SupervisorState.READY:
        raise RuntimeError(f"the engine did not start: {sup.message}")
    _wait(qapp, lambda: bool(ember.controller.models), 120, "the model list")
    _settle(qapp)
    return qapp, ember


def measure_round(ember, i: int, res: dict, total: int, rss_before: int, args) -> dict:
    """A settled round's figures: RSS, glibc's in-use and free bytes, Python's blocks, QObjects
    under the window (after the warm-up and at the end only: see count_qobjects) and live chats."""
    from engine.service.allocator import malloc_stats, resident_bytes
    from engine.service.heap import live_objects

    rss, mal = resident_bytes(), malloc_stats() or {}
    return {"round": i, **res, "total_replies": total, "rss": rss,
            "rss_delta": rss - rss_before, "malloc": mal,
            "py_blocks": sys.getallocatedblocks(),
            "qobjects": count_qobjects(ember.window) if i in (args.warmup - 1, args.rounds - 1) else None,
            "live": live_objects(WATCHED),
            "chats_open": len(ember.window._views)}


def _row(r: dict) -> str:
    mal = r["malloc"]
    malloc = f"{mal['in_use'] / MiB:7.1f} {mal['free'] / MiB:6.1f}" if mal else f"{'-':>7s} {'-':>6s}"
    return (f"{r['round']:5d} {r['replies']:7d} {r['errors']:3d} {r['stopped']:7d} {r['seconds']:5.1f} "
            f"{r['rss'] / MiB:8.1f} {r['rss_delta'] / MiB:+7.1f} {malloc}      {r['py_blocks'] / 1000:6.0f}k "
            f"{r['qobjects'] if r['qobjects'] is not None else '-':>9}  "
            + "/".join(str(r["live"][w]) for w in WATCHED[:5]))


def _print_growth(baseline) -> None:
    """What Python allocated most since the warm-up's tracemalloc snapshot."""
    top = tracemalloc.take_snapshot().compare_to(baseline, "traceback")[:6]
    print("  what grew most after warm-up (tracemalloc):")
    for stat in top:
        print(f"    {stat.size_diff:+d} B in {stat.count_diff:+d} blocks\n      "
              + "\n      ".join(stat.traceback.format()[-6:]))


def _shut_down(ember) -> None:
    for view in list(ember.window._views.values()):
        view.stop()
    ember.controller.shutdown()
    ember.chat_store.close()


def summarize(rounds: list[dict], total: int, args) -> dict:
    """Growth per 1,000 replies after warm-up (RSS and Python blocks), QObjects after warm-up and
    at the end, replies and errors."""
    after = rounds[args.warmup:] if len(rounds) > args.warmup + 1 else rounds
    xs = [r["total_replies"] for r in after]
    return {"rounds": rounds, "rss_first_mb": round(after[0]["rss"] / MiB, 1),
            "rss_last_mb": round(after[-1]["rss"] / MiB, 1),
            "rss_growth_mb_per_1k": round(slope(xs, [r["rss"] for r in after]) * 1000 / MiB, 2),
            "py_blocks_per_1k": round(slope(xs, [r["py_blocks"] for r in after]) * 1000),
            "qobjects_first_last": (rounds[min(args.warmup, len(rounds)) - 1]["qobjects"], rounds[-1]["qobjects"]),
            "replies": total, "errors": sum(r["errors"] for r in rounds)}


def soak(args) -> dict:
    from engine.service.allocator import resident_bytes

    qapp, ember = start_app(args)
    rss0, total, rounds, baseline = resident_bytes(), 0, [], None
    if args.tracemalloc:
        tracemalloc.start(8)
    print(f"  GUI process ready: RSS {rss0 / MiB:.1f} MiB (engine pid {ember.controller.supervisor.pid})", flush=True)
    print("round replies err stopped     s  RSS MiB    ΔRSS malloc used/free  py blocks  QObjects  "
          + "/".join(w[:6] for w in WATCHED[:5]), flush=True)
    try:
        for i in range(args.rounds):
            res = one_round(qapp, ember, i, args)
            _settle(qapp)
            total += res["replies"]
            r = measure_round(ember, i, res, total, rounds[-1]["rss"] if rounds else rss0, args)
            rounds.append(r)
            if args.tracemalloc and i == args.warmup - 1:
                baseline = tracemalloc.take_snapshot()
            print(_row(r), flush=True)
            if args.json_out:
                Path(args.json_out).write_text(json.dumps({"rounds": rounds}, default=str))
        if baseline is not None:
            _print_growth(baseline)
    finally:
        _shut_down(ember)
    return summarize(rounds, total, args)


def run(args) -> int:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"ember bench soak-gui: --backend {args.backend}, {args.rounds} rounds × {args.chats} chats "
          f"(+1 regenerated), {args.keep} kept open, up to {args.max_tokens} tokens; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs", flush=True)
    try:
        s = soak(args)
    except (RuntimeError, TimeoutError) as e:
        print(f"  failed: {e}", file=sys.stderr)
        return 1
    last = s["rounds"][-1]
    extra = {k: v for k, v in last["live"].items() if k in ("ChatView", "TranscriptView") and v > args.keep}
    ok = {f"RSS growth after warm-up ≤ {args.max_growth_mb:g} MB per 1,000 replies":
          s["rss_growth_mb_per_1k"] <= args.max_growth_mb,
          "no errors": s["errors"] == 0,
          f"no more than the {args.keep} open chats' views alive": not extra,
          "QObjects under the window flat after warm-up (± 4: status polls in flight)":
          s["qobjects_first_last"][1] <= s["qobjects_first_last"][0] + 4}
    print(f"\nGUI process: {s['replies']} replies, {s['errors']} errors; RSS {s['rss_first_mb']} -> "
          f"{s['rss_last_mb']} MiB after warm-up: {s['rss_growth_mb_per_1k']:+.2f} MiB per 1,000 replies; "
          f"Python blocks {s['py_blocks_per_1k']:+d} per 1,000; QObjects under the window "
          f"{s['qobjects_first_last'][0]} -> {s['qobjects_first_last'][1]}; live at the end {last['live']}")
    for goal, met in ok.items():
        print(f"  [{'ok' if met else 'MISSED'}] {goal}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(s, indent=2, default=str))
    return 0 if all(ok.values()) else 1
