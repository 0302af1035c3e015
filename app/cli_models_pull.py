"""`ember models search|pull`: the catalog and the hub from a terminal, downloads with a progress bar."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from app.cli_models_common import catalog as _catalog, fit_text as _fit_text, setup as _setup, size_text as _size
from app.cli_models_common import table as _table


def add_parsers(action) -> None:
    """`search` and `pull` under `ember models` (`action(name, func, help)` makes one)."""
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
    p.add_argument("--mmproj", metavar="FILE", help="with --hub: also this projector (mmproj) file of the repository, "
                                                    "paired with the model so that it sees images")
    p.add_argument("--catalog", type=Path, help="a catalog JSON file instead of the bundled one")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


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
    from app.hub import HubError, gguf_entries, projector_files, repo_files, with_hub_projector

    try:
        entries = gguf_entries(settings.hub_base_url, args.hub)
        entry = next((e for e in entries if args.model in (e.id, e.file)), None)
        if entry is None:
            raise SystemExit(f"error: {args.hub} has no GGUF file {args.model!r}; it has: "
                             + (", ".join(e.id for e in entries) or "none"))
        if args.mmproj:
            return with_hub_projector(settings.hub_base_url, entry, args.mmproj)
        if names := [f.name for f in projector_files(repo_files(settings.hub_base_url, args.hub))]:
            print(f"note: {args.hub} has vision projectors ({', '.join(names)}): add --mmproj FILE for a model "
                  "that sees images", file=sys.stderr)
        return entry
    except HubError as e:
        raise SystemExit(f"error: {e}") from None


def cmd_pull(args) -> int:
    settings, store = _setup(args)
    if args.mmproj and not args.hub:
        print("error: --mmproj goes with --hub (a catalog entry names its own projector)", file=sys.stderr)
        return 2
    if args.hub:
        return _pull(args, settings, store, _hub_entry(args, settings))
    catalog = _catalog(args, settings)
    entry = catalog.get(args.model)
    if entry is None:
        near = [e.id for e in catalog.search(args.model.replace("-", " "))][:5]
        print(f"error: {args.model!r} is not in the catalog" + (f"; did you mean: {', '.join(near)}" if near else ""),
              file=sys.stderr)
        return 2
    return _pull(args, settings, store, _with_hub_facts(settings, entry))


def _with_hub_facts(settings, entry):
    """The entry with the hub's sizes and sha256 where the catalog has none, so each file (a vision
    model's projector too) is checked against the hub's metadata; offline or unlisted, as it is
    (the download then checks the hub's ETag where it sends one)."""
    from app.hub import HubError, with_hub_facts

    if all(f.size_bytes and f.sha256 for f in entry.files):
        return entry
    try:
        return with_hub_facts(settings.hub_base_url, [entry])[0]
    except HubError as e:
        print(f"note: the hub's file facts are unavailable ({e}); checking the download as it arrives",
              file=sys.stderr)
        return entry


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
    also = f" with its projector {entry.mmproj}" if entry.mmproj else ""
    print(f"pulling {entry.id} from {entry.url}{also}", file=sys.stderr)
    try:
        job = dm.start(entry)
    except ValueError as e:  # a pair this runner cannot run (M-RoPE): said before a byte is fetched
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    if m.mmproj:
        print(f"with its projector {m.mmproj} (sha256 {m.mmproj_sha256}): chats may carry images")
    return 0
