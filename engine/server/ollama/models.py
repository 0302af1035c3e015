"""What Ollama's /api/tags, /api/show and /api/ps say of a model: the store's manifest (or the
file's own header for a model served by --model PATH), in Ollama's field names."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from engine.model_files.architectures import embeds_only
from engine.model_files.gguf_file import GGUFFile
from engine.model_files.manifest import is_model_id, manifest_path, read_manifest
from engine.model_files.meta import read_meta
from engine.model_files.tool_call_syntax import tool_format
from engine.service.served_model import LoadedModel, ModelSpec
from engine.server.reasoning import ReasoningFormat, detect_format


def tag(model_id: str) -> str:
    """Ollama's name for an installed model: its id, tagged latest."""
    return f"{model_id}:latest"


_digests: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256, for models outside the store


def _sha256(path: Path) -> str:
    """The store's digest rule (manifest.py): a file's sha256; a directory's sorted
    "relpath\\0sha256\\n" lines hashed."""
    if path.is_dir():
        lines = "".join(f"{p.relative_to(path).as_posix()}\0{_sha256(p)}\n"
                        for p in sorted(path.rglob("*")) if p.is_file())
        return hashlib.sha256(lines.encode()).hexdigest()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]


def facts(store, spec: ModelSpec) -> dict:
    """The manifest's fields for a model (read from the file for one served by --model PATH)."""
    if store.root is not None and is_model_id(spec.id):
        p = manifest_path(store.root, spec.id)
        if p.is_file():
            return read_manifest(p)
    path = Path(spec.path)
    meta = read_meta(path)
    size = (sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir()
            else path.stat().st_size)
    added = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat()
    return {"format": meta.format, "architecture": meta.architecture, "parameter_count": meta.parameter_count,
            "quantization": meta.quantization, "context_length": meta.context_length,
            "num_layers": meta.num_layers, "num_kv_heads": meta.num_kv_heads, "size_bytes": size,
            "sha256": _sha256(path), "added_at": added, "path": str(path)}


def _parameter_size(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}" if unit == "B" else f"{n / div:.0f}{unit}"
    return str(n)


def details(f: dict) -> dict:
    arch = f.get("architecture") or ""
    return {"parent_model": "", "format": f.get("format", "gguf"), "family": arch, "families": [arch],
            "parameter_size": _parameter_size(int(f.get("parameter_count") or 0)),
            "quantization_level": f.get("quantization") or ""}


def listing(spec: ModelSpec, f: dict) -> dict:
    return {"name": tag(spec.id), "model": tag(spec.id), "modified_at": f.get("added_at"),
            "size": f.get("size_bytes", 0), "digest": f.get("sha256", ""), "details": details(f)}


def _template_of(spec: ModelSpec, loaded: LoadedModel | None) -> str:
    if loaded is not None and loaded.spec.id == spec.id:
        return loaded.engine.chat_template.source
    if spec.chat_template:  # the user's template for this installed model
        return Path(spec.chat_template).read_text(encoding="utf-8", errors="replace")
    path = Path(spec.path)
    if path.is_file():
        with GGUFFile(path) as header:
            t = header.get("tokenizer.chat_template")
        return t if isinstance(t, str) else ""
    config = path / "tokenizer_config.json"
    if config.is_file():
        t = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        return t if isinstance(t, str) else ""
    return ""


def show(store, spec: ModelSpec, loaded: LoadedModel | None) -> dict:
    f = facts(store, spec)
    arch = f.get("architecture") or "unknown"
    info = {"general.architecture": arch, "general.parameter_count": f.get("parameter_count"),
            "general.name": spec.name or spec.id}
    if f.get("context_length"):
        info[f"{arch}.context_length"] = f["context_length"]
    if f.get("num_layers"):
        info[f"{arch}.block_count"] = f["num_layers"]
    if f.get("num_kv_heads"):
        info[f"{arch}.attention.head_count_kv"] = f["num_kv_heads"]
    template = _template_of(spec, loaded)
    parameters = ""
    if loaded is not None and loaded.spec.id == spec.id:  # what this server serves it with
        parameters = f"num_ctx {loaded.engine.max_model_len}"
        stops = loaded.engine.chat_template.turn_stops
        parameters += "".join(f"\nstop {json.dumps(s)}" for s in stops)
    if embeds_only(arch):  # as Ollama says of nomic-embed-text and friends
        caps = ["embedding"]
    else:
        caps = ["completion"] + (["tools"] if tool_format(template) is not None else [])
        if detect_format(template, ())[0] is not ReasoningFormat.NONE:
            caps.append("thinking")
        if spec.mmproj:  # loaded with its projector: chats may carry images
            caps.append("vision")
    return {"modelfile": "", "parameters": parameters, "template": template, "details": details(f),
            "model_info": info, "capabilities": caps, "modified_at": f.get("added_at")}
