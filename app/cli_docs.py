"""`ember docs add|list|rm|search`: collections of documents from a terminal, in this process, on
the store the app's engine uses (app/docs_local.py); a collection is one of the engine's vector
stores, so the window and OpenAI's vector-store API see what these commands do."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from app.settings_args import add_settings_args, settings_from_args

SETTINGS_FIELDS = ["data_dir", "models_dir"]


def register(sub: argparse._SubParsersAction) -> None:
    docs = sub.add_parser("docs", help="index documents into collections and search them (for `chat --docs`)")
    dsub = docs.add_subparsers(dest="docs_command", metavar="ACTION", required=True)

    def action(name: str, func, help: str, embedder: bool = False) -> argparse.ArgumentParser:
        p = dsub.add_parser(name, help=help)
        add_settings_args(p, SETTINGS_FIELDS + (["embedding_model"] if embedder else []))
        p.set_defaults(func=func)
        return p

    p = action("add", cmd_add, "index files and folders into a collection (made if new); again: sync it", True)
    p.add_argument("collection")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, or folders (their supported files, recursively)")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads of the embedder (default: all)")
    p = action("list", cmd_list, "collections with their file counts, or one collection's files")
    p.add_argument("collection", nargs="?")
    p = action("rm", cmd_rm, "remove a collection, or some of its files (their chunks with them)")
    p.add_argument("collection")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or folders to take out (default: the whole "
                                                           "collection)")
    p = action("search", cmd_search, "the passages of a collection that best match a query", True)
    p.add_argument("collection")
    p.add_argument("query")
    p.add_argument("-k", type=int, default=5, help="how many passages (default: 5)")
    p.add_argument("--mode", choices=("hybrid", "vector", "bm25"), default="hybrid",
                   help="hybrid (BM25 and vectors fused by rank; default), vector or bm25 alone")
    p.add_argument("--threads", "-t", type=int, default=None, help=argparse.SUPPRESS)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _existing(store, name: str):
    from app.docs_local import collection

    found = collection(store, name)
    if found is None:
        print(f"error: no collection named {name!r} (`ember docs list` shows them)", file=sys.stderr)
    return found


def cmd_add(args) -> int:
    from app.docs_add import add
    from app.docs_local import NoEmbedder, collection, embedding_model, open_store

    settings = settings_from_args(args)
    store = open_store(settings)
    existing = collection(store, args.collection)
    store.close()
    try:
        model = embedding_model(settings, getattr(args, "embedding_model", None),
                                existing.embed_model if existing else None)
    except NoEmbedder as e:
        print(e, file=sys.stderr)
        return 2
    return add(settings, args.collection, args.paths, model, args.threads)


def cmd_list(args) -> int:
    from app.docs_local import open_store

    store = open_store(settings_from_args(args))
    if args.collection is None:
        stores = store.stores()
        if not stores:
            print("No collections. Add one with `ember docs add NAME FILES_OR_FOLDERS`.")
            return 0
        rows = [["COLLECTION", "FILES", "FAILED", "CHUNKS", "EMBEDDING MODEL", "ID"]]
        for s in stores:
            files = store.store_files(s.id)
            rows.append([s.name, str(len(files)), str(sum(f.status == "failed" for f in files)),
                         str(sum(f.chunks for f in files)), s.embed_model or "-", s.id])
        print(_table(rows))
        return 0
    target = _existing(store, args.collection)
    if target is None:
        return 1
    rows = [["FILE", "STATUS", "CHUNKS", "PATH OR ERROR"]]
    for sf in store.store_files(target.id):
        f = store.file(sf.file_id)
        rows.append([f.filename, sf.status, str(sf.chunks), sf.error or ("(uploaded)" if f.uploaded else f.path)])
    print(_table(rows) if len(rows) > 1 else f"{target.name} holds no files")
    return 0


def _matches(path: str, wanted: list[Path]) -> bool:
    p = Path(path)
    return any(p == w or w in p.parents for w in wanted)


def cmd_rm(args) -> int:
    from app.docs_local import forget, open_store

    store = open_store(settings_from_args(args))
    target = _existing(store, args.collection)
    if target is None:
        return 1
    files = [store.file(sf.file_id) for sf in store.store_files(target.id)]
    if not args.paths:
        store.delete_store(target.id)
        for f in files:
            forget(store, target.id, f.id)
        print(f"removed collection {target.name} ({len(files)} files)")
        return 0
    wanted = [Path(p).expanduser().resolve() for p in args.paths]
    gone = [f for f in files if not f.uploaded and _matches(f.path, wanted)]
    for f in gone:
        forget(store, target.id, f.id)
        print(f"removed {f.path}")
    if not gone:
        print(f"error: no file of {target.name} is at {', '.join(args.paths)}", file=sys.stderr)
        return 1
    return 0


def snippet(text: str, query: str, width: int = 220) -> str:
    """About `width` characters of the passage around the first query word it holds."""
    flat = " ".join(text.split())
    words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
    at = min((i for i in (flat.lower().find(w) for w in words) if i >= 0), default=0)
    start = max(0, at - width // 3)
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


def cmd_search(args) -> int:
    from app.docs_local import LocalEmbedder, NoEmbedder, embedding_model, open_store
    from engine.docs.retrieve import search

    settings = settings_from_args(args)
    store = open_store(settings)
    target = _existing(store, args.collection)
    if target is None:
        return 1
    vector = None
    if args.mode != "bm25" and target.embed_model is not None:
        try:
            model = embedding_model(settings, getattr(args, "embedding_model", None), target.embed_model,
                                    prefer_collection=True)
        except NoEmbedder as e:
            print(e, file=sys.stderr)
            return 2
        embed = LocalEmbedder(model, args.threads)
        vector = embed([args.query])[0]
        embed.close()
    try:
        hits = search(store, [target.id], args.query, vector, top_k=args.k, mode=args.mode)
    except ValueError as e:  # the embedder is not the one that built the collection
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not hits:
        print("no passages match")
    for i, h in enumerate(hits, 1):
        where = f" · {h.location}" if h.location else ""
        print(f"{i}. {h.filename}{where}  (score {h.score:.3f})\n   {snippet(h.text, args.query)}")
    return 0
