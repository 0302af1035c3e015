"""`ember models list|rm|import|verify`: the model store from a terminal (search and pull:
app/cli_models_pull.py)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.cli_models_common import SETTINGS_FIELDS, fit_text as _fit_text, setup as _setup, size_text as _size
from app.cli_models_common import table as _table
from app.cli_models_pull import add_parsers as pull_parsers
from app.model_remove import remove_model
from app.settings_args import add_settings_args


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
    pull_parsers(action)
    action("rm", cmd_rm, "remove an installed model (and its chats' context kept on disk)").add_argument("model")
    p = action("import", cmd_import, "import a local GGUF file, a GPTQ/AWQ/compressed-tensors directory, or a "
                                     "sentence-transformers BERT folder (converted to GGUF once)")
    p.add_argument("path", type=Path)
    p.add_argument("--outtype", choices=("f16", "f32"), default="f16",
                   help="weights of the GGUF a BERT folder is converted to (default: f16)")
    p.add_argument("--id", dest="model_id", help="model id (default: from the file's metadata)")
    p.add_argument("--mmproj", type=Path, metavar="PROJ",
                   help="a vision model's projector GGUF (its mmproj file), kept with the model: chats with it "
                        "may carry images (importing an installed model again with this pairs it)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--move", dest="mode", action="store_const", const="move", help="move instead of copy")
    mode.add_argument("--link", dest="mode", action="store_const", const="link",
                      help="register in place, no copy")
    p = action("verify", cmd_verify, "check installed files against their sha256")
    p.add_argument("models", nargs="*", help="ids (default: all)")


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
    rows = [["ID", "ARCH", "QUANT", "SIZE", "CONTEXT", "INPUT", "SOURCE", "FIT"]]
    for m in models:
        rows.append([m.id, m.architecture, m.quantization, _size(m.size_bytes), str(m.context_length or "?"),
                     "text+images" if m.mmproj else "text", m.source, _fit_text(fit_advice(m.size_bytes, m, machine))])
    print(_table(rows))
    return 0


def cmd_rm(args) -> int:
    settings, store = _setup(args)
    try:  # its blocks in the prefix cache's disk tier go at once, then the model and its projector
        outside = remove_model(store, settings.kv_cache_dir, args.model)
    except KeyError:
        print(f"error: no installed model {args.model!r}", file=sys.stderr)
        return 1
    kept = f" (left in place: {', '.join(outside)})" if outside else ""
    print(f"removed {args.model}{kept}")
    return 0


def cmd_import(args) -> int:
    from app.store import ModelFileError
    from engine.model_files.fit import UnsupportedArchitecture

    _, store = _setup(args)
    try:
        m = store.import_path(args.path, model_id=args.model_id, mode=args.mode, outtype=args.outtype,
                              mmproj=args.mmproj)
    except (ModelFileError, FileExistsError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UnsupportedArchitecture) else 1
    print(f"imported {m.id} ({m.architecture}, {m.quantization}, {m.parameter_count:,} parameters) -> {m.path}")
    if m.mmproj:
        print(f"with its projector {m.mmproj}: chats with {m.id} may carry images")
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
