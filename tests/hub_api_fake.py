"""A local fake of the Hugging Face hub's JSON API on top of store_helpers.FakeHub (no internet here):
`GET /api/models?search=&filter=gguf` and `GET /api/models/{repo}/revision/{rev}?blobs=true`, answered
in the hub's own shapes (the fields huggingface_hub's HfApi reads), plus the files at /resolve/."""
from __future__ import annotations

import hashlib

from store_helpers import FakeHub


def add_repo(hub: FakeHub, repo: str, files: dict[str, bytes], downloads: int = 100,
             readme: bool = True) -> None:
    """Serve `repo`'s files for download and in the API: its search listing and its blobs listing."""
    for name, data in files.items():
        hub.add(repo, name, data)
    siblings = [{"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest(),
                 "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 135}}
                for name, data in files.items()]
    if readme:
        siblings.append({"rfilename": "README.md", "size": 12, "blobId": "0" * 40})
    info = {"_id": "x" * 24, "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": "a" * 40,
            "private": False, "gated": False, "disabled": False, "downloads": downloads, "likes": 3,
            "tags": ["gguf"], "library_name": "gguf", "createdAt": "2026-01-01T00:00:00.000Z",
            "lastModified": "2026-01-02T00:00:00.000Z", "siblings": siblings}
    hub.api[f"/api/models/{repo}/revision/main"] = lambda q, info=info: info
    hub.api[f"/api/models/{repo}"] = lambda q, info=info: info
    listing = hub.__dict__.setdefault("_listing", [])
    listing.append({k: info[k] for k in ("_id", "id", "modelId", "downloads", "likes", "tags", "private",
                                           "library_name", "createdAt")})

    def search(q: dict[str, list[str]]) -> list[dict]:
        words = (q.get("search") or [""])[0].lower().split()
        want_gguf = "gguf" in q.get("filter", [])
        hits = [m for m in listing if all(w in m["id"].lower() for w in words)
                and (not want_gguf or "gguf" in m["tags"])]
        limit = int((q.get("limit") or [len(hits)])[0])
        return sorted(hits, key=lambda m: -m["downloads"])[:limit]

    hub.api["/api/models"] = search
