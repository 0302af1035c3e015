"""The curated catalog of known models (resources/catalog.json).

An entry names a hub repository and its file(s); download URLs are built from a hub base URL
passed in (the `hub_base_url` setting), so a mirror or a test server can stand in for the hub.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote, urlsplit

from engine.model_files.fit import FORMATS
from engine.model_files.manifest import validate_model_id
from resources import resource_path

DEFAULT_HUB = "https://huggingface.co"
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# average bits per weight of each quantization (llama.cpp's quantize table; GPTQ/AWQ int4 with
# group 128: 4 bits + an f16 scale and a 4-bit zero per 128 weights) — for size *estimates* only
BITS_PER_WEIGHT = {"Q4_0": 4.5, "Q4_1": 5.0, "Q5_0": 5.5, "Q5_1": 6.0, "Q8_0": 8.5, "Q4_K_S": 4.58,
                   "Q4_K_M": 4.85, "Q5_K_M": 5.69, "Q6_K": 6.56, "F16": 16.0, "BF16": 16.0,
                   "GPTQ-INT4-G128": 4.16, "AWQ-INT4-G128": 4.16,
                   "MXFP4": 4.6}  # gpt-oss: MXFP4 experts (4.25), attention and embeddings wider


class CatalogError(ValueError):
    """A catalog file that does not have the expected shape."""


@dataclass(frozen=True)
class CatalogFile:
    name: str  # path inside the repo
    size_bytes: int | None = None
    sha256: str | None = None  # None: not known; the downloader computes and records it


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    name: str
    family: str
    parameters: str  # "1.5B": as the publisher names the size
    architecture: str
    quantization: str
    format: str
    repo: str
    files: tuple[CatalogFile, ...]
    license: str
    revision: str = "main"
    suggested_draft: str | None = None
    context_length: int | None = None
    num_layers: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    notes: str | None = None
    mmproj: str | None = None  # a vision model: the name of its projector among `files` (after the model)
    hub_base_url: str = field(default=DEFAULT_HUB, compare=False)

    @property
    def file(self) -> str:
        return self.files[0].name

    @property
    def url(self) -> str:
        return self.file_url(self.file)

    @property
    def sha256(self) -> str | None:
        """The model file's sha256 for GGUF entries; None for directories or unknown."""
        return self.files[0].sha256 if self.format == "gguf" else None

    @property
    def size_bytes(self) -> int | None:
        sizes = [f.size_bytes for f in self.files]
        return None if any(s is None for s in sizes) else sum(sizes)

    @property
    def estimated_size_bytes(self) -> int | None:
        """size_bytes when known, else parameters × bits per weight / 8 (a rough figure for fit advice)."""
        if self.size_bytes is not None:
            return self.size_bytes
        bpw = BITS_PER_WEIGHT.get(self.quantization)
        n = parse_parameters(self.parameters)
        return int(n * bpw / 8) if bpw and n else None

    def file_url(self, name: str) -> str:
        return hub_file_url(self.hub_base_url, self.repo, self.revision, name)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("files", "hub_base_url")}
        d["files"] = [vars(f).copy() for f in self.files]
        return d

    @classmethod
    def from_dict(cls, d: dict, hub_base_url: str = DEFAULT_HUB) -> "CatalogEntry":
        try:
            files = tuple(CatalogFile(**f) for f in d["files"])
            known = set(cls.__dataclass_fields__) - {"files", "hub_base_url"}
            entry = cls(**{k: v for k, v in d.items() if k in known}, files=files,
                        hub_base_url=hub_base_url)
        except (KeyError, TypeError) as e:
            raise CatalogError(f"catalog entry {d.get('id')!r}: {e}") from e
        _check_entry(entry)
        return entry


def display_names(entries) -> dict[str, str]:
    """id -> the name to show: the entry's name, with its quantization where several share the name
    ("SmolLM2 135M Instruct Q4_1" and "… Q8_0"), so no two rows read the same."""
    entries = list(entries)
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.name] = counts.get(e.name, 0) + 1
    return {e.id: f"{e.name} {e.quantization}" if counts[e.name] > 1 else e.name for e in entries}


def parse_parameters(text: str) -> float | None:
    """"1.5B" -> 1.5e9, "135M" -> 1.35e8."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMB])\s*", text or "", re.I)
    return float(m.group(1)) * {"K": 1e3, "M": 1e6, "B": 1e9}[m.group(2).upper()] if m else None


def hub_file_url(base: str, repo: str, revision: str, name: str) -> str:
    """`{base}/{repo}/resolve/{revision}/{file}`: the Hugging Face hub's download route."""
    return f"{base.rstrip('/')}/{quote(repo)}/resolve/{quote(revision, safe='')}/{quote(name)}"


def _check_entry(e: CatalogEntry) -> None:
    validate_model_id(e.id)
    if e.format not in FORMATS:
        raise CatalogError(f"{e.id}: format {e.format!r} not in {FORMATS}")
    if not e.files:
        raise CatalogError(f"{e.id}: no files")
    if e.format == "gguf" and len(e.files) != 1 + bool(e.mmproj):
        raise CatalogError(f"{e.id}: a GGUF entry names exactly one file (and its mmproj projector, if any)")
    if e.mmproj is not None and (e.format != "gguf" or e.files[-1].name != e.mmproj):
        raise CatalogError(f"{e.id}: mmproj {e.mmproj!r} must be the GGUF entry's second file")
    for f in e.files:
        if f.sha256 is not None and not _SHA256_RE.fullmatch(f.sha256):
            raise CatalogError(f"{e.id}: {f.name}: sha256 must be 64 lowercase hex digits or null")
        if f.size_bytes is not None and (not isinstance(f.size_bytes, int) or f.size_bytes <= 0):
            raise CatalogError(f"{e.id}: {f.name}: size_bytes must be a positive integer or null")
        if f.name.startswith("/") or ".." in f.name.split("/"):
            raise CatalogError(f"{e.id}: unsafe file name {f.name!r}")


def check_hub_url(url: str) -> str:
    """An http(s) base URL without its trailing slash; CatalogError otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc:
        raise CatalogError(f"hub_base_url must be an http(s) URL, got {url!r}")
    return url.rstrip("/")


class Catalog:
    """The known models; `search` matches id, name, family, quantization and format words."""

    def __init__(self, entries: list[CatalogEntry]):
        self.entries = list(entries)
        self._by_id = {e.id: e for e in self.entries}
        if len(self._by_id) != len(self.entries):
            raise CatalogError("duplicate ids in the catalog")
        for e in self.entries:
            if e.suggested_draft is not None and e.suggested_draft not in self._by_id:
                raise CatalogError(f"{e.id}: suggested_draft {e.suggested_draft!r} is not in the catalog")

    @classmethod
    def load(cls, path: Path | None = None, hub_base_url: str = DEFAULT_HUB) -> "Catalog":
        base = check_hub_url(hub_base_url)
        text = Path(path or resource_path("catalog.json")).read_text("utf-8")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise CatalogError(f"catalog is not valid JSON: {e}") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
            raise CatalogError("catalog must be an object with a 'models' list")
        return cls([CatalogEntry.from_dict(d, base) for d in doc["models"]])

    def with_hub(self, hub_base_url: str) -> "Catalog":
        base = check_hub_url(hub_base_url)
        return Catalog([replace(e, hub_base_url=base) for e in self.entries])

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, model_id: str) -> CatalogEntry | None:
        return self._by_id.get(model_id)

    def search(self, query: str = "") -> list[CatalogEntry]:
        """Entries containing every word of the query (case-insensitive), in catalog order."""
        words = query.lower().split()

        def text(e: CatalogEntry) -> str:
            return " ".join((e.id, e.name, e.family, e.parameters, e.quantization, e.format,
                             e.architecture, e.repo, e.license)).lower()

        return [e for e in self.entries if all(w in text(e) for w in words)]
