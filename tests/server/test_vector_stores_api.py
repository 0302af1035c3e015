"""OpenAI's Files and Vector Stores API on a real engine process, with the official `openai` client
over real HTTP: the test set of tests/docs_kit.py (facts no model knows, in PDF, DOCX, PPTX,
Markdown and code, beside distractors) uploaded, indexed by the real all-MiniLM-L6-v2 in the
background, and searched: each question's own file is the top result.

Oracles we did not write: the `openai` client (every request and object shape), pypdf, markitdown,
SQLite's FTS5, sqlite-vec and the real MiniLM.
"""
from __future__ import annotations

import httpx
import openai
import pytest
from docs_kit import QUESTIONS, minilm_store, write_corpus
from server_util import openai_client, start_engine

pytestmark = pytest.mark.slow
CTX = 2048  # the tiny chat model's context: a few passages in its byte-level tokens


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_factory):
    root = tmp_path_factory.mktemp("vs")
    minilm_store(root / "models")
    proc = start_engine(tiny_model_factory(ctx=CTX), root, "--models-dir", str(root / "models"),
                        "--docs-dir", str(root / "docs"), backend="auto")
    yield proc, root
    proc.stop()


@pytest.fixture(scope="module")
def indexed(server):
    proc, root = server
    client = openai_client(proc)
    files = write_corpus(root / "corpus")
    uploaded = {f.name: client.files.create(file=open(f, "rb"), purpose="assistants") for f in files}
    store = client.vector_stores.create(name="kit", metadata={"owner": "tests"})
    batch = client.vector_stores.file_batches.create_and_poll(
        vector_store_id=store.id, file_ids=[u.id for u in uploaded.values()], poll_interval_ms=200)
    return client, store, uploaded, batch


def test_every_file_is_indexed_and_counted(indexed):
    client, store, uploaded, batch = indexed
    assert batch.status == "completed"
    assert batch.file_counts.completed == len(uploaded) and batch.file_counts.failed == 0
    got = client.vector_stores.retrieve(store.id)
    assert got.status == "completed" and got.file_counts.total == len(uploaded)
    assert got.metadata == {"owner": "tests"} and got.name == "kit"
    assert got.usage_bytes == sum(u.bytes for u in uploaded.values())
    listed = {f.id: f.status for f in client.vector_stores.files.list(store.id)}
    assert listed == {u.id: "completed" for u in uploaded.values()}
    assert all(f.model_extra["chunks"] >= 1 for f in client.vector_stores.files.list(store.id))  # Ember's count


@pytest.mark.parametrize("q", QUESTIONS, ids=[q.filename for q in QUESTIONS])
def test_the_file_that_holds_the_answer_is_the_top_result(indexed, q):
    client, store, _, _ = indexed
    page = client.vector_stores.search(store.id, query=q.text, max_num_results=3)
    top = page.data[0]
    assert top.filename == q.filename, [d.filename for d in page.data]
    assert q.fact in top.content[0].text
    assert 0 < top.score <= 1 and len(page.data) <= 3


def test_files_api_round_trips_and_deleting_a_file_removes_its_chunks(indexed, server, tmp_path):
    client, store, uploaded, _ = indexed
    f = tmp_path / "extra.txt"
    f.write_text("The zebra crossing on Quillon Street was painted purple in 2024.")
    up = client.files.create(file=open(f, "rb"), purpose="assistants")
    assert up.filename == "extra.txt" and up.bytes == f.stat().st_size and up.object == "file"
    assert client.files.retrieve(up.id).id == up.id
    assert client.files.content(up.id).read() == f.read_bytes()
    assert up.id in {x.id for x in client.files.list()}
    vsf = client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=up.id, poll_interval_ms=200,
                                                     attributes={"path": str(f)})
    assert vsf.status == "completed" and vsf.attributes == {"path": str(f)}
    assert client.vector_stores.search(store.id, query="Quillon Street crossing colour").data[0].file_id == up.id
    r = client.chat.completions.create(model="model.gguf", max_tokens=2, messages=[
        {"role": "user", "content": "Quillon Street crossing colour?"}],
        extra_body={"documents": {"vector_store_ids": [store.id], "max_num_results": 1}})
    assert r.model_extra["sources"][0]["attributes"] == {"path": str(f)}  # where the window finds the file
    assert client.files.delete(up.id).deleted
    hits = client.vector_stores.search(store.id, query="Quillon Street crossing colour").data
    assert up.id not in {h.file_id for h in hits}
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(up.id)


def test_a_file_ember_cannot_read_fails_alone_with_its_reason(indexed, tmp_path):
    client, _, _, _ = indexed
    bad = tmp_path / "scan.pdf"
    bad.write_bytes(b"%PDF-1.4\n%garbage that is no PDF at all\n")
    good = tmp_path / "ok.md"
    good.write_text("# Note\n\nThe orchard has nine pear trees.")
    s = client.vector_stores.create(name="mixed")
    ids = [client.files.create(file=open(p, "rb"), purpose="assistants").id for p in (bad, good)]
    batch = client.vector_stores.file_batches.create_and_poll(vector_store_id=s.id, file_ids=ids,
                                                              poll_interval_ms=200)
    assert (batch.file_counts.failed, batch.file_counts.completed) == (1, 1)
    failed = client.vector_stores.files.retrieve(file_id=ids[0], vector_store_id=s.id)
    assert failed.status == "failed" and "scan.pdf" in failed.last_error.message
    assert "PDF" in failed.last_error.message
    assert client.vector_stores.delete(s.id).deleted


def test_bad_requests_get_openai_shaped_errors(indexed, server):
    client, store, _, _ = indexed
    proc, _ = server
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve("vs_nope")
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.files.create(vector_store_id=store.id, file_id="file-nope")
    with pytest.raises(openai.BadRequestError):
        client.vector_stores.search(store.id, query="   ")
    r = httpx.post(proc.base_url + "/v1/files", headers={"Authorization": f"Bearer {proc.api_key}"},
                   files={"file": ("a.txt", b"x")}, data={"purpose": "nonsense"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"


def test_a_chat_with_documents_gets_the_passages_and_says_which(indexed, server):
    """The `documents` extension: the passages go into the user's turn (the prompt grows by them)
    and the reply carries them as `sources`, streamed on its first chunk."""
    client, store, uploaded, _ = indexed
    q = QUESTIONS[0]
    ask = {"model": "model.gguf", "max_tokens": 4, "temperature": 0,
           "messages": [{"role": "user", "content": q.text}]}
    plain = client.chat.completions.create(**ask)
    docs = {"vector_store_ids": [store.id], "max_num_results": 2}
    with_docs = client.chat.completions.create(**ask, extra_body={"documents": docs})
    sources = with_docs.model_extra["sources"]
    assert [s["index"] for s in sources] == [1, 2] and sources[0]["filename"] == q.filename
    assert q.fact in sources[0]["text"] and sources[0]["file_id"] == uploaded[q.filename].id
    assert sources[0]["vector_store_id"] == store.id and sources[0]["location"] == "page 2"
    grown = with_docs.usage.prompt_tokens - plain.usage.prompt_tokens
    assert grown > len(sources[0]["text"]) // 8  # the passages are in the prompt
    chunks = list(client.chat.completions.create(**ask, stream=True, extra_body={"documents": docs}))
    assert chunks[0].model_extra["sources"] == sources
    assert all("sources" not in c.model_extra for c in chunks[1:])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(**ask, extra_body={"documents": {"vector_store_ids": ["vs_nope"]}})


def test_a_chat_that_names_no_model_is_not_sent_to_the_embedder(indexed):
    """After a search the embedding model is the one used last; a chat naming no model still goes
    to the newest model that makes text."""
    client, store, _, _ = indexed
    client.vector_stores.search(store.id, query="lighthouse")
    hi = {"max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    chat_id = client.chat.completions.create(model="model.gguf", **hi).model
    client.vector_stores.search(store.id, query="lighthouse")
    assert client.chat.completions.create(model="", **hi).model == chat_id


def test_only_the_passages_that_fit_the_context_are_given(indexed):
    client, store, _, _ = indexed
    ask = {"model": "model.gguf", "max_tokens": 4, "temperature": 0,
           "messages": [{"role": "user", "content": QUESTIONS[3].text}]}
    r = client.chat.completions.create(**ask, extra_body={"documents": {"vector_store_ids": [store.id],
                                                                        "max_num_results": 20}})
    sources = r.model_extra["sources"]
    assert 0 < len(sources) < 20 and sources[0]["filename"] == QUESTIONS[3].filename
    assert r.usage.prompt_tokens + 4 <= CTX


def test_an_indexing_file_reports_its_progress_until_done(indexed, tmp_path):
    client, store, _, _ = indexed
    big = tmp_path / "long.md"
    big.write_text("\n\n".join(f"## Part {i}\n\nParagraph {i} about the harbour's tides and boats. " * 3
                               for i in range(150)))
    up = client.files.create(file=open(big, "rb"), purpose="assistants")
    client.vector_stores.files.create(vector_store_id=store.id, file_id=up.id)
    seen = []
    while (f := client.vector_stores.files.retrieve(file_id=up.id, vector_store_id=store.id)).status == "in_progress":
        if "progress" in f.model_extra:
            seen.append(f.model_extra["progress"])
    assert f.status == "completed" and "progress" not in f.model_extra
    for p in seen:
        assert 0 < p["chunks_done"] <= p["chunks_total"]


@pytest.mark.parametrize("end", ["kill", "stop"])
def test_a_file_left_indexing_by_a_stopped_engine_is_indexed_on_the_next_start(tmp_path, tiny_model_factory, end):
    """The engine is killed (or stopped, as the app's quit does) while a long file indexes; the next
    engine on the same folder finishes it."""
    root = tmp_path
    minilm_store(root / "models")
    args = (tiny_model_factory(ctx=CTX), root, "--models-dir", str(root / "models"), "--docs-dir", str(root / "docs"))
    proc = start_engine(*args, backend="auto")
    client = openai_client(proc)
    doc = root / "long.md"
    doc.write_text("\n\n".join(f"## Entry {i}\n\nThe ferry left pier {i} at dawn with {i * 3} crates." for i in range(300)))
    up = client.files.create(file=open(doc, "rb"), purpose="assistants")
    store = client.vector_stores.create(name="resume")
    client.vector_stores.files.create(vector_store_id=store.id, file_id=up.id)
    while "progress" not in (f := client.vector_stores.files.retrieve(file_id=up.id, vector_store_id=store.id)).model_extra:
        assert f.status == "in_progress"
    if end == "kill":  # as a crash: no shutdown at all
        proc.proc.kill()
        proc.proc.wait()
    proc.stop()
    proc = start_engine(*args, backend="auto")
    try:
        client = openai_client(proc)
        done = client.vector_stores.files.poll(file_id=up.id, vector_store_id=store.id, poll_interval_ms=200)
        assert done.status == "completed"
        assert client.vector_stores.search(store.id, query="ferry pier 299 crates").data[0].file_id == up.id
    finally:
        proc.stop()


def test_indexing_waits_while_a_chat_is_replying(indexed, server, tmp_path):
    """The yield rule (engine/server/embeddings.py): background embedding does not run beside a
    running reply. While one streams, the file's progress moves by at most the batch that was
    already being embedded when the reply started; after the reply, the indexing finishes."""
    client, store, _, _ = indexed
    doc = tmp_path / "tides.md"
    doc.write_text("\n\n".join(f"## Day {i}\n\nHigh tide at {i % 12} o'clock, low tide six hours later." * 2
                               for i in range(500)))
    up = client.files.create(file=open(doc, "rb"), purpose="assistants")
    client.vector_stores.files.create(vector_store_id=store.id, file_id=up.id)

    def progress():
        f = client.vector_stores.files.retrieve(file_id=up.id, vector_store_id=store.id)
        assert f.status == "in_progress", "the indexing ended before the test could look"
        return f.model_extra.get("progress", {}).get("chunks_done", 0)

    while progress() == 0:
        pass
    stream = client.chat.completions.create(model="model.gguf", max_tokens=1500, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Tell a long story."}],
                                            extra_body={"ignore_eos": True})
    seen = []
    for i, _ in enumerate(stream):
        if i in (5, 200, 1000):  # the reply is running: it is being read
            seen.append(progress())
    assert seen[2] - seen[0] <= 16  # indexer.BATCH: the batch in flight when the reply began, at most
    assert client.vector_stores.files.poll(file_id=up.id, vector_store_id=store.id,
                                           poll_interval_ms=200).status == "completed"


def test_the_embedding_model_may_be_a_file_and_a_missing_one_is_named(tmp_path, tiny_model_factory):
    from app.store import ModelStore

    minilm_store(tmp_path / "models")
    gguf = next(m.path for m in ModelStore(tmp_path / "models").list())
    for choice, ok in ((str(gguf), True), ("no-such-embedder", False)):
        proc = start_engine(tiny_model_factory(ctx=CTX), tmp_path, "--docs-dir", str(tmp_path / f"docs-{ok}"),
                            "--embedding-model", choice, backend="auto")
        try:
            client = openai_client(proc)
            (tmp_path / "a.md").write_text("# A\n\nThe kettle whistles at noon.")
            f = client.files.create(file=open(tmp_path / "a.md", "rb"), purpose="assistants")
            s = client.vector_stores.create(name="x")
            done = client.vector_stores.files.create_and_poll(vector_store_id=s.id, file_id=f.id, poll_interval_ms=100)
            assert done.status == ("completed" if ok else "failed")
            if not ok:
                assert "no-such-embedder" in done.last_error.message
        finally:
            proc.stop()


def test_a_file_over_the_upload_limit_is_refused_before_it_is_read(indexed, server):
    """A 2 GB upload: OpenAI's 413 shape at once (the Content-Length is checked before the body is
    read), and the store is as it was."""
    import http.client
    import json
    import socket

    client, _, _, _ = indexed
    proc, _ = server
    before = [f.id for f in client.files.list()]
    host, port = proc.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {proc.api_key}\r\n"
                     f"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: {2 << 30}\r\n\r\n".encode())
        reply = http.client.HTTPResponse(sock)
        reply.begin()
        assert reply.status == 413
        assert json.loads(reply.read())["error"]["code"] == "request_too_large"
    assert [f.id for f in client.files.list()] == before
