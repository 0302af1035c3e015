"""`ember docs add COLLECTION PATH...`: files and folders indexed into a collection, with a line per
file and a summary. A folder is walked for the extensions Ember reads (hidden files and folders
left out); a file named on its own is tried whatever its extension, so an unsupported one says so.
Adding again syncs: unchanged files are skipped (the Indexer compares sha256 and embedder), changed
ones indexed again, and a file of the collection that is gone from the disk is removed with its
chunks. Ctrl-C stops between two embedding batches: the file being indexed keeps its previous
chunks (or none, if it was new) and is marked cancelled, the ones before it are done, and running
the same command again goes on where it stopped.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.docs_local import LocalEmbedder, collection, forget, open_store


@dataclass
class Tally:
    indexed: list[str] = field(default_factory=list)
    chunks: int = 0
    unchanged: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    cancelled: bool = False


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def discover(paths: list[str]) -> tuple[list[Path], list[str]]:
    """The files to index (a folder's supported files, recursively, in name order) and the
    paths that do not exist."""
    from engine.docs.convert import SUPPORTED

    files, missing = [], []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p).parts
                if f.is_file() and f.suffix.lower() in SUPPORTED and f.suffix and not any(x.startswith(".") for x in rel):
                    files.append(f.resolve())
        elif p.is_file():
            files.append(p.resolve())
        else:
            missing.append(raw)
    return list(dict.fromkeys(files)), missing


def remove_gone(store, store_id: str, tally: Tally) -> None:
    """The collection's own files (not uploads) that are no longer on the disk, with their chunks."""
    for sf in store.store_files(store_id):
        f = store.file(sf.file_id)
        if f is not None and not f.uploaded and not Path(f.path).exists():
            forget(store, store_id, f.id)
            tally.removed.append(f.path)
            print(f"removed {f.path} (gone from the disk)")


def add(settings, name: str, paths: list[str], model, threads: int | None, out=None) -> int:
    from engine.docs.indexer import Indexer

    out = out or sys.stdout
    files, missing = discover(paths)
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # each failure is printed below, in its line
        logging.getLogger("engine.docs.indexer").setLevel(logging.ERROR)
    store = open_store(settings)
    embed = LocalEmbedder(model, threads)
    tally = Tally(failed=[(m, f"{m}: no such file or folder") for m in missing])
    for _, why in tally.failed:
        print(why, file=sys.stderr)
    cancel = threading.Event()
    previous = _on_ctrl_c(cancel)
    t0 = time.monotonic()
    try:
        target = collection(store, name, create=True)
        remove_gone(store, target.id, tally)
        indexer = Indexer(store, embed, model.id)
        for i, path in enumerate(files, 1):
            if cancel.is_set():
                break
            _index_one(indexer, target.id, path, f"[{i}/{len(files)}] {path.name}", cancel, tally, out)
        tally.cancelled = cancel.is_set()
    except KeyboardInterrupt:  # the second Ctrl-C: an open transaction rolled back, the file keeps its old chunks
        tally.cancelled = True
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        embed.close()
    done = sum(len(x) for x in (tally.indexed, tally.unchanged, tally.failed)) - len(missing)
    _summary(store, target, tally, len(files) - done, time.monotonic() - t0, out)
    store.close()
    return 130 if tally.cancelled else 1 if tally.failed else 0


def _on_ctrl_c(cancel: threading.Event):
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(*_):
        if cancel.is_set():  # a second Ctrl-C: at once (the store's transactions keep it whole)
            raise KeyboardInterrupt
        cancel.set()
        print("\nstopping after this batch (Ctrl-C again to stop at once)…", file=sys.stderr)

    return signal.signal(signal.SIGINT, stop)


def _index_one(indexer, store_id: str, path: Path, head: str, cancel, tally: Tally, out) -> None:
    from engine.docs.convert import DocError

    tty = getattr(out, "isatty", lambda: False)()
    embedded = []

    def progress(p):
        embedded.append(p.chunks_done)
        if tty:
            out.write(f"\r{head}: {p.chunks_done}/{p.chunks_total} chunks")
            out.flush()

    try:
        f = indexer.add_path(store_id, path)
        sf = indexer.index(store_id, f.id, progress, cancel)
    except DocError as e:
        sf, why = None, str(e)
    end = "\r\033[K" if tty and embedded else ""
    if sf is None or sf.status == "failed":
        why = sf.error if sf is not None else why
        tally.failed.append((str(path), why))
        print(f"{end}{head}: failed: {why}", file=out)
    elif sf.status == "cancelled":
        tally.cancelled = True
        print(f"{end}{head}: cancelled (its previous chunks, if any, are kept)", file=out)
    elif not embedded:
        tally.unchanged.append(str(path))
        print(f"{end}{head}: unchanged, skipped ({_n(sf.chunks, 'chunk')})", file=out)
    else:
        tally.indexed.append(str(path))
        tally.chunks += sf.chunks
        print(f"{end}{head}: indexed, {_n(sf.chunks, 'chunk')}", file=out)


def _summary(store, target, tally: Tally, not_reached: int, seconds: float, out) -> None:
    files = store.store_files(target.id)
    parts = [f"{len(tally.indexed)} indexed ({_n(tally.chunks, 'chunk')})", f"{len(tally.unchanged)} unchanged"]
    parts += [f"{len(tally.failed)} failed"] if tally.failed else []
    parts += [f"{len(tally.removed)} removed"] if tally.removed else []
    print(f"{target.name}: {', '.join(parts)} in {seconds:.1f} s; the collection holds {len(files)} files, "
          f"{sum(f.chunks for f in files)} chunks", file=out)
    if tally.cancelled:
        print(f"Stopped by Ctrl-C: {not_reached} files not reached. The index is consistent (every file has "
              "its old chunks or its new ones); run the same command again to go on.", file=out)
