"""`ember models list|search|pull|rm|import|verify`: the model store from a terminal."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.settings import Settings
from app.settings_args import add_settings_args, settings_from_args
from engine.kv_disk.folders import forget_model

if TYPE_CHECKING:
    from app.store import ModelStore

SETTINGS_FIELDS = ["data_dir", "models_dir", "hub_base_url", "max_parallel_downloads"]


def register(sub: argparse._SubParsersAction) -> None:
    models = sub.add_parser("models", help="list, search, download, import, verify and remove models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)

    def action(name: str, func, help: str) -> argparse.ArgumentParser:
        p = msub.add_parser(name, help=help)
        add_settings_args(p, SETTINGS_FIELDS)
        p.set_defaults(func=func)
        return p

    p = action("list", cmd_list, "installed models, with whether they fit this machine")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = action("search", cmd_search, "search the catalog of known models (or, with --hub, the model hub)")
    p.add_argument("query", nargs="*", help="words that must all match (id, name, family, quant, format)")
    p.add_argument("--hub", action="store_true", help="search the hub (hub_base_url) for GGUF models instead")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--catalog", type=Path, help="a catalog JSON file instead of the bundled one")
    p = action("pull", cmd_pull, "download a catalog model (resumes an interrupted download)")
    p.add_argument("model", help="catalog id (see `ember models search`), or with --hub the id a hub search "
                                 "printed")
    p.add_argument("--hub", metavar="REPO", help="download a GGUF file of this hub repository (see "
                                                 "`ember models search --hub`); sizes and sha256 from the hub")
    p.add_argument("--catalog", type=Path, help="a catalog JSON file instead of the bundled one")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    action("rm", cmd_rm, "remove an installed model (and its chats' context kept on disk)").add_argument("model")
    p = action("import", cmd_import, "import a local GGUF file, a GPTQ/AWQ/compressed-tensors directory, or a "
                                     "sentence-transformers BERT folder (converted to GGUF once)")
    p.add_argument("path", type=Path)
    p.add_argument("--outtype", choices=("f16", "f32"), default="f16",
                   help="weights of the GGUF a BERT folder is converted to (default: f16)")
    p.add_argument("--id", dest="model_id", help="model id (default: from the file's metadata)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--move", dest="mode", action="store_const", const="move", help="move instead of copy")
    mode.add_argument("--link", dest="mode", action="store_const", const="link",
                      help="register in place, no copy")
    p = action("verify", cmd_verify, "check installed files against their sha256")
    p.add_argument("models", nargs="*", help="ids (default: all)")


def _setup(args) -> tuple[Settings, ModelStore]:
    from app.store import ModelStore

    settings = settings_from_args(args)
    return settings, ModelStore(settings.models_dir)


def _catalog(args, settings):
    from app.catalog import Catalog

    return Catalog.load(getattr(args, "catalog", None), hub_base_url=settings.hub_base_url)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def _fit_text(advice) -> str:
    if not advice.fits:
        return "does not fit"
    return f"{advice.device}: {advice.max_context} ctx × {advice.max_parallel} chats"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_list(args) -> int:
    from app.fit import fit_advice, probe_host

    _, store = _setup(args)
    store.ensure_default()
    machine = probe_host()
    models = store.list()
    if args.json:
        print(json.dumps([m.to_dict() | {"fit": vars(fit_advice(m.size_bytes, m, machine))} for m in models],
                         indent=2))
        return 0
    if not models:
        print("No models installed. Try `ember models search` and `ember models pull ID`.")
        return 0
    rows = [["ID", "ARCH", "QUANT", "SIZE", "CONTEXT", "SOURCE", "FIT"]]
    for m in models:
        rows.append([m.id, m.architecture, m.quantization, _size(m.size_bytes), str(m.context_length or "?"),
                     m.source, _fit_text(fit_advice(m.size_bytes, m, machine))])
    print(_table(rows))
    return 0


def cmd_search(args) -> int:
    from app.fit import fit_advice, probe_host

    settings, store = _setup(args)
    if args.hub:
        return _search_hub(args, settings, store)
    entries = _catalog(args, settings).search(" ".join(args.query))
    machine = probe_host()
    installed = {m.id for m in store.list()}
    if args.json:
        print(json.dumps([e.to_dict() | {"url": e.url, "installed": e.id in installed} for e in entries], indent=2))
        return 0
    if not entries:
        print("No catalog model matches.")
        return 1
    rows = [["ID", "PARAMS", "QUANT", "FORMAT", "SIZE", "LICENSE", "FIT", ""]]
    for e in entries:
        size = _size(e.size_bytes) if e.size_bytes else f"~{_size(e.estimated_size_bytes)}"
        rows.append([e.id, e.parameters, e.quantization, e.format, size, e.license,
                     _fit_text(fit_advice(e.size_bytes, e, machine)), "installed" if e.id in installed else ""])
    print(_table(rows))
    return 0


class ProgressBar:
    """Draws DownloadEvents on a terminal: one redrawn line on a TTY, a line per 10% otherwise."""

    def __init__(self, stream=sys.stderr, width: int = 30):
        self.stream, self.width = stream, width
        self.tty = stream.isatty()
        self.last_decile = -1
        self.last_draw = 0.0

    def __call__(self, e) -> None:
        if e.state != "running":
            if self.tty:
                self.stream.write("\r\033[K")
            self.stream.write(f"{e.state}{': ' + e.error if e.error else ''}\n")
            self.stream.flush()
            return
        frac = e.bytes_done / e.bytes_total if e.bytes_total else 0.0
        filled = int(self.width * frac)
        eta = f" ETA {e.eta_s:.0f}s" if e.eta_s is not None else ""
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {100 * frac:5.1f}% "
                f"{_size(e.bytes_done)} / {_size(e.bytes_total)}  {_size(int(e.rate_bps))}/s{eta}")
        if self.tty:
            now = time.monotonic()
            if now - self.last_draw >= 0.1 or frac >= 1.0:
                self.last_draw = now
                self.stream.write("\r\033[K" + line)
                self.stream.flush()
        elif int(10 * frac) > self.last_decile:
            self.last_decile = int(10 * frac)
            self.stream.write(line + "\n")
            self.stream.flush()


def _search_hub(args, settings, store) -> int:
    """`ember models search --hub WORDS`: the hub's GGUF files, with the hub's sizes and a fit column."""
    from app.fit import fit_advice, probe_host
    from app.hub import HubError, search_hub_entries

    try:
        entries = search_hub_entries(settings.hub_base_url, " ".join(args.query))
    except HubError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([e.to_dict() | {"url": e.url} for e in entries], indent=2))
        return 0
    if not entries:
        print("Nothing on the hub matches.")
        return 1
    machine, installed = probe_host(), {m.id for m in store.list()}
    rows = [["ID", "REPO", "QUANT*", "SIZE", "FIT", ""]]
    for e in entries:
        rows.append([e.id, e.repo, e.quantization, _size(e.size_bytes), _fit_text(fit_advice(e.size_bytes, e, machine)),
                     "installed" if e.id in installed else ""])
    print(_table(rows))
    print("* read from the file name; `ember models pull ID --hub REPO` downloads one", file=sys.stderr)
    return 0


def _hub_entry(args, settings):
    from app.hub import HubError, gguf_entries

    try:
        entries = gguf_entries(settings.hub_base_url, args.hub)
    except HubError as e:
        raise SystemExit(f"error: {e}") from None
    entry = next((e for e in entries if args.model in (e.id, e.file)), None)
    if entry is None:
        raise SystemExit(f"error: {args.hub} has no GGUF file {args.model!r}; it has: "
                         + (", ".join(e.id for e in entries) or "none"))
    return entry


def cmd_pull(args) -> int:
    settings, store = _setup(args)
    if args.hub:
        return _pull(args, settings, store, _hub_entry(args, settings))
    catalog = _catalog(args, settings)
    entry = catalog.get(args.model)
    if entry is None:
        near = [e.id for e in catalog.search(args.model.replace("-", " "))][:5]
        print(f"error: {args.model!r} is not in the catalog" + (f"; did you mean: {', '.join(near)}" if near else ""),
              file=sys.stderr)
        return 2
    return _pull(args, settings, store, entry)


def _pull(args, settings, store, entry) -> int:
    from app.downloads import DownloadManager

    if store.get(entry.id) is not None:
        print(f"{entry.id} is already installed")
        return 0
    dm = DownloadManager(store, settings.data_dir / "downloads", settings.hub_base_url,
                         settings.max_parallel_downloads, autostart=False)
    if not getattr(args, "verbose", False):
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would break the bar
    if not args.no_progress:
        dm.subscribe(ProgressBar())
    print(f"pulling {entry.id} from {entry.url}", file=sys.stderr)
    job = dm.start(entry)
    try:
        final = dm.wait(job)
    except KeyboardInterrupt:
        dm.pause(job)
        dm.wait(job, timeout=10)
        print("\npaused; run the same command again to resume", file=sys.stderr)
        return 130
    if final.state != "done":
        print(f"error: {entry.id}: {final.error or final.state}", file=sys.stderr)
        return 1
    m = store.get(entry.id)
    print(f"installed {m.id} ({m.architecture}, {m.quantization}, {_size(m.size_bytes)}) sha256 {m.sha256}")
    return 0


def cmd_rm(args) -> int:
    settings, store = _setup(args)
    m = store.get(args.model)
    if m is None:
        print(f"error: no installed model {args.model!r}", file=sys.stderr)
        return 1
    forget_model(settings.kv_cache_dir, m.path)  # its blocks in the prefix cache's disk tier, at once
    store.delete(m.id)
    kept = "" if Path(m.path).is_relative_to(store.root) else f" (its file {m.path} was left in place)"
    print(f"removed {m.id}{kept}")
    return 0


def cmd_import(args) -> int:
    from app.store import ModelFileError
    from engine.model_files.fit import UnsupportedArchitecture

    _, store = _setup(args)
    try:
        m = store.import_path(args.path, model_id=args.model_id, mode=args.mode, outtype=args.outtype)
    except (ModelFileError, FileExistsError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UnsupportedArchitecture) else 1
    print(f"imported {m.id} ({m.architecture}, {m.quantization}, {m.parameter_count:,} parameters) -> {m.path}")
    if m.converted_from:
        print(f"converted from {m.converted_from}: an embedding model; `ember serve --model-id {m.id}` answers "
              "/v1/embeddings")
    return 0


def cmd_verify(args) -> int:
    _, store = _setup(args)
    ids = args.models or [m.id for m in store.list()]
    bad = 0
    for model_id in ids:
        try:
            ok = store.verify(model_id)
        except KeyError:
            print(f"{model_id}: not installed")
            bad += 1
            continue
        print(f"{model_id}: {'OK' if ok else 'FAILED (sha256 differs or file missing)'}")
        bad += not ok
    return 1 if bad else 0
