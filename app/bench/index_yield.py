"""`ember bench index-yield`: a chat's decode speed while a long document indexes in the background,
against the same chat alone, on one real engine process (the documents issue's bar: at least 80%).

Each round streams one chat of exactly --max-tokens tokens alone, then starts indexing a generated
document of --pages pages into a fresh vector store, waits until its progress shows, and streams
the same chat again; the round counts only if the indexing was still running when the chat ended.
The indexing's own speed (chunks per second, conversion and storage included) is measured once,
with no chat, at the end. The embedder is the store's embedding model (--embedding-model, else
the first installed one), as the app's engine uses it.
"""
from __future__ import annotations

import asyncio
import secrets
import statistics
import tempfile
import time
from pathlib import Path

from app.bench.lib.http_chat import stream_chat

PAGE = ("## Section {i}\n\nThe harbour master's log for day {i} records the tides, the boats that came in, "
        "the weather over the cape and the cargo each one carried. "
        + "Nets were mended and the pier was swept; the lamp was trimmed at dusk and the bell rang twice "
          "before the fog lifted. " * 6)


def document(pages: int) -> str:
    return "\n\n".join(PAGE.format(i=i) for i in range(pages))


async def _wait_indexing(http, store: str, file_id: str, started: bool) -> dict:
    """The file's object once it shows progress (started) or once it is no longer in progress."""
    while True:
        f = (await http.get(f"/v1/vector_stores/{store}/files/{file_id}")).json()
        if (started and "progress" in f) or f["status"] != "in_progress":
            return f
        await asyncio.sleep(0.05)


async def _round(http, model: str, file_id: str, i: int, max_tokens: int) -> dict | None:
    alone = await stream_chat(http, i, max_tokens, model)
    store = (await http.post("/v1/vector_stores", json={"name": f"yield-{i}"})).json()["id"]
    (await http.post(f"/v1/vector_stores/{store}/files", json={"file_id": file_id})).raise_for_status()
    await _wait_indexing(http, store, file_id, started=True)
    during = await stream_chat(http, i, max_tokens, model)
    f = (await http.get(f"/v1/vector_stores/{store}/files/{file_id}")).json()
    await http.delete(f"/v1/vector_stores/{store}")  # cancels the rest of the indexing
    if f["status"] != "in_progress":
        print(f"round {i}: the indexing ended before the chat did; not counted (use more --pages)")
        return None
    return {"alone": alone["stream_tok_s"], "during": during["stream_tok_s"],
            "progress": f["progress"]["chunks_done"]}


async def _measure(base_url: str, key: str, model: str, args, doc: Path) -> tuple[list[dict], float, int]:
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600) as http:
        with open(doc, "rb") as fh:
            file_id = (await http.post("/v1/files", files={"file": (doc.name, fh)},
                                       data={"purpose": "assistants"})).json()["id"]
        await stream_chat(http, 0, 8, model)  # loads nothing new; warms the chat path
        rounds = [r for i in range(1, args.runs + 1) if (r := await _round(http, model, file_id, i, args.max_tokens))]
        store = (await http.post("/v1/vector_stores", json={"name": "alone"})).json()["id"]
        t0 = time.perf_counter()
        await http.post(f"/v1/vector_stores/{store}/files", json={"file_id": file_id})
        f = await _wait_indexing(http, store, file_id, started=False)
        return rounds, time.perf_counter() - t0, f.get("usage_bytes", 0)


def run(args) -> int:
    from app.engine_process import EngineProcess
    from app.settings import Settings
    from engine.model_files.bundled import default_model_path

    settings = Settings.load()
    models_dir = args.models_dir or str(settings.models_dir)
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-yield-"))
    doc = tmp / "harbour_log.md"
    doc.write_text(document(args.pages))
    model = args.model or str(default_model_path())
    extra = ["--embedding-model", args.embedding_model] if args.embedding_model else []
    key = secrets.token_urlsafe(16)
    proc = EngineProcess(["--model", model, "--models-dir", models_dir, "--docs-dir", str(tmp / "docs"),
                          "--threads", str(args.threads), *extra], api_key=key, log_path=tmp / "engine.log")
    with proc.start(timeout=600):
        served = Path(model).name
        rounds, index_s, _ = asyncio.run(_measure(proc.base_url, key, served, args, doc))
    if not rounds:
        print("no round counted")
        return 1
    chunks = _chunks(tmp / "docs")
    ratios = [r["during"] / r["alone"] for r in rounds]
    print(f"chat model {Path(model).name}, {args.threads} threads, {args.max_tokens} tokens a reply; "
          f"document {args.pages} pages ({doc.stat().st_size / 1e3:.0f} kB, {chunks} chunks)")
    print(f"{'round':<8}{'alone tok/s':>12}{'indexing tok/s':>16}{'ratio':>8}")
    for i, (r, q) in enumerate(zip(rounds, ratios), 1):
        print(f"{i:<8}{r['alone']:>12.1f}{r['during']:>16.1f}{q:>8.2f}")
    print(f"median ratio {statistics.median(ratios):.2f} (bar: 0.80); indexing alone: {chunks / index_s:.1f} "
          f"chunks/s ({index_s:.1f} s for the document)")
    return 0


def _chunks(docs_dir: Path) -> int:
    """The document's chunks, as the engine's store counted them."""
    from engine.docs.store import DB_NAME, DocStore

    store = DocStore(docs_dir / DB_NAME)
    try:
        return max((sf.chunks for s in store.stores() for sf in store.store_files(s.id)), default=0)
    finally:
        store.close()


def register(bench_sub) -> None:
    p = bench_sub.add_parser("index-yield", help="a chat's decode speed while a document indexes, against alone")
    p.add_argument("--model", "-m", help="chat model GGUF (default: the bundled model)")
    p.add_argument("--models-dir", help="the model store holding the embedding model (default: the settings')")
    p.add_argument("--embedding-model", help="installed embedding model id (default: the first installed)")
    p.add_argument("--threads", "-t", type=int, default=2)
    p.add_argument("--pages", type=int, default=300, help="pages of the generated document")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--runs", type=int, default=3)
    p.set_defaults(func=run)
