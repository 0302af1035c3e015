"""`ember cache info|clear`: the engine's disk tier of the prefix cache (<data_dir>/kv-cache), the
chats' context kept across restarts (engine/kv_disk/). `ember models rm` deletes a model's blocks at
once; those of a model file deleted otherwise go the next time an engine opens the tier; `clear`
deletes them all (an engine that is running reads its deleted blocks as misses and computes them
again)."""
from __future__ import annotations

import sys


def register(sub) -> None:
    from app.settings_args import add_settings_args

    p = sub.add_parser("cache", help="the chats' context kept on disk: info | clear")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, helptext, func in (("info", "what the cache holds, per model", cmd_info),
                                 ("clear", "delete every block the cache holds", cmd_clear)):
        v = verbs.add_parser(verb, help=helptext)
        v.set_defaults(func=func)
        add_settings_args(v, ["data_dir"])


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def cmd_info(args) -> int:
    from app.settings_args import settings_from_args
    from engine.kv_disk.folders import cache_folders
    from engine.kv_disk.store import effective_budget

    settings = settings_from_args(args)
    root = settings.kv_cache_dir
    folders = cache_folders(root)
    used = sum(f.num_bytes for f in folders)
    budget = effective_budget(root if root.is_dir() else settings.data_dir, int(settings.kv_disk_gib * 2**30), used)
    state = "off" if settings.kv_disk_gib <= 0 else f"budget {_gib(budget)} (setting {settings.kv_disk_gib:g} GiB)"
    print(f"{root}: {sum(f.num_blocks for f in folders)} blocks, {_gib(used)}; {state}")
    for f in folders:
        notes = [n for n, on in (("in use", f.in_use), ("model removed", f.orphaned)) if on]
        print(f"  {f.model or '(unknown model)'}: {f.num_blocks} blocks, {_gib(f.num_bytes)}"
              + (f" ({', '.join(notes)})" if notes else ""))
    return 0


def cmd_clear(args) -> int:
    from app.settings_args import settings_from_args
    from engine.kv_disk.folders import clear

    settings = settings_from_args(args)
    try:
        blocks, size = clear(settings.kv_cache_dir)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"deleted {blocks} blocks ({_gib(size)}) from {settings.kv_cache_dir}")
    return 0
