"""The model hub's own metadata through huggingface_hub's HfApi: search for GGUF repositories, and each
file's size and sha256 (the LFS object id) for a repo, so sizes, fit badges and the checksum a download
verifies come from the hub rather than from hand-written numbers. Qt-free and blocking (the GUI calls
it from workers). `base_url` is the `hub_base_url` setting: a mirror or a test server can stand in.

A hub listing names files, not facts: the quantization and parameter count shown for a search result
are read from the file name and marked as such; the model's real facts come from the file once it is
downloaded (the store reads its header).
"""
from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from app.catalog import CatalogEntry, CatalogFile
from engine.model_files.manifest import slugify

_QUANT_RE = re.compile(r"(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?![A-Za-z0-9])", re.I)
_PARAMS_RE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([BM])(?![a-z])", re.I)
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


class HubError(RuntimeError):
    """The hub could not be asked (offline, refused, not found); the message says which, in one line."""


@dataclass(frozen=True)
class HubFile:
    name: str
    size_bytes: int | None
    sha256: str | None


@dataclass(frozen=True)
class HubRepo:
    repo: str
    downloads: int
    likes: int


def _api(base_url: str):
    from huggingface_hub import HfApi

    return HfApi(endpoint=base_url.rstrip("/"), token=False)  # no stored token is sent anywhere


def _check_network(base_url: str) -> None:
    """Offline, say so at once: huggingface_hub retries a failed name lookup for ~25 s as if transient."""
    host = urlsplit(base_url).hostname or ""
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as e:
        raise HubError(f"no network: cannot look up {host} (check the connection)") from e


def _call(what: str, func, *args, base_url: str, **kwargs):
    _check_network(base_url)
    try:
        return func(*args, **kwargs)
    except Exception as e:  # httpx errors, HfHubHTTPError, RepositoryNotFoundError…: one line for the user
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise HubError(f"{what}: {text}") from e


def search_gguf(base_url: str, query: str, limit: int = 20) -> list[HubRepo]:
    """Repositories with GGUF files matching `query`, most downloaded first."""
    models = _call("hub search", lambda: list(_api(base_url).list_models(
        search=query or None, filter="gguf", sort="downloads", limit=limit)), base_url=base_url)
    return [HubRepo(m.id, int(getattr(m, "downloads", 0) or 0), int(getattr(m, "likes", 0) or 0)) for m in models]


def repo_files(base_url: str, repo: str, revision: str = "main") -> list[HubFile]:
    """Every file of a repo with its size and, for LFS files, its sha256 (the hub's `blobs` listing)."""
    info = _call(repo, _api(base_url).model_info, repo, revision=revision, files_metadata=True, base_url=base_url)
    out = []
    for s in info.siblings or []:
        lfs = getattr(s, "lfs", None)
        sha = getattr(lfs, "sha256", None) if lfs is not None else None
        size = getattr(s, "size", None) or (getattr(lfs, "size", None) if lfs is not None else None)
        out.append(HubFile(s.rfilename, int(size) if size else None, sha if isinstance(sha, str) else None))
    return out


def gguf_entries(base_url: str, repo: str, revision: str = "main") -> list[CatalogEntry]:
    """One downloadable entry per single-file GGUF of `repo` (split files and projectors left out)."""
    entries = []
    for f in repo_files(base_url, repo, revision):
        base = f.name.rsplit("/", 1)[-1]
        if not base.lower().endswith(".gguf") or _SPLIT_RE.search(base) or "mmproj" in base.lower():
            continue
        quant = guess_quant(base)
        stem = base[:-5]
        entries.append(CatalogEntry.from_dict({
            "id": slugify(stem)[:120] or "hub-model", "name": repo.split("/")[-1], "family": repo.split("/")[0],
            "parameters": guess_parameters(repo + " " + base) or "?", "architecture": "unknown",
            "quantization": quant or "GGUF", "format": "gguf", "repo": repo, "revision": revision,
            "license": "see the model card", "notes": f"from the hub: {repo}/{f.name}",
            "files": [{"name": f.name, "size_bytes": f.size_bytes, "sha256": f.sha256}],
        }, hub_base_url=base_url.rstrip("/")))
    return entries


def projector_files(files: Iterable[HubFile]) -> list[HubFile]:
    """A repo's vision projectors (llama.cpp's converter names them mmproj-*.gguf)."""
    return [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" in f.name.rsplit("/", 1)[-1].lower()]


def with_hub_projector(base_url: str, entry: CatalogEntry, mmproj: str) -> CatalogEntry:
    """`entry` (a GGUF of a hub repo) with the repo's projector file `mmproj` as its second file, so a
    download fetches both, checks both against the hub's sha256 and pairs them; HubError naming the
    projectors the repo has when it has no such one."""
    projectors = projector_files(repo_files(base_url, entry.repo, entry.revision))
    f = next((p for p in projectors if mmproj in (p.name, p.name.rsplit("/", 1)[-1])), None)
    if f is None:
        raise HubError(f"{entry.repo} has no projector {mmproj!r}; it has: "
                       + (", ".join(p.name for p in projectors) or "none"))
    return replace(entry, files=(*entry.files, CatalogFile(f.name, f.size_bytes, f.sha256)), mmproj=f.name)


MAX_REPOS = 8  # file listings fetched per search (one request each)


def search_hub_entries(base_url: str, query: str, max_repos: int = MAX_REPOS) -> list[CatalogEntry]:
    """The GGUF files of the repos that match `query`, most downloaded first."""
    entries: list[CatalogEntry] = []
    for repo in search_gguf(base_url, query, limit=max_repos):
        try:
            entries += gguf_entries(base_url, repo.repo)
        except HubError:  # one repo the hub will not list (gated, removed): skip it
            continue
    return entries


def with_hub_facts(base_url: str, entries: Iterable[CatalogEntry]) -> list[CatalogEntry]:
    """Catalog entries with each file's size and sha256 filled in from the hub where the catalog lacks them.

    Raises HubError on the first repo the hub cannot answer about when offline (one failure is enough
    to know); a repo it answers about without the file leaves that entry as it was.
    """
    out, listings = [], {}
    for e in entries:
        if all(f.size_bytes and f.sha256 for f in e.files):
            out.append(e)
            continue
        key = (e.repo, e.revision)
        if key not in listings:
            try:
                listings[key] = {f.name: f for f in repo_files(base_url, e.repo, e.revision)}
            except HubError as err:
                if _offline(err):
                    raise
                listings[key] = {}
        known = listings[key]
        files = tuple(replace(f, size_bytes=f.size_bytes or getattr(known.get(f.name), "size_bytes", None),
                              sha256=f.sha256 or getattr(known.get(f.name), "sha256", None)) for f in e.files)
        out.append(replace(e, files=files))
    return out


def _offline(err: HubError) -> bool:
    text = str(err).lower()
    return "no network" in text or "connect" in text


def guess_quant(file_name: str) -> str | None:
    """"qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" -> "Q4_K_M" (a hint from the name, not a fact)."""
    m = _QUANT_RE.search(file_name.rsplit("/", 1)[-1][:-5] if file_name.endswith(".gguf") else file_name)
    return m.group(1).upper() if m else None


def guess_parameters(text: str) -> str | None:
    """"Qwen2.5-Coder-0.5B-Instruct" -> "0.5B" (a hint from the name)."""
    m = _PARAMS_RE.search(text)
    return f"{m.group(1)}{m.group(2).upper()}" if m else None


__all__ = ["CatalogFile", "HubError", "HubFile", "HubRepo", "gguf_entries", "guess_parameters", "guess_quant",
           "projector_files", "repo_files", "search_gguf", "search_hub_entries", "with_hub_facts", "with_hub_projector"]
