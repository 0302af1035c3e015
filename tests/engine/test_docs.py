"""engine/docs/: structural chunking, reciprocal rank fusion, conversion and its refusals, and the
store with the indexer on the real all-MiniLM-L6-v2: incremental by content, a removed file leaves
no chunk in any table, a cancelled or failed indexing leaves the previous chunks whole.

Oracles we did not write: pypdf and fpdf2 (PDFs written and read by others), markitdown, SQLite's
FTS5, sqlite-vec (its cosine distance against numpy's), the real MiniLM.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
from docs_kit import minilm_embed, write_corpus

from engine.docs.chunk import MAX_CHARS, chunk_sections, split_long
from engine.docs.convert import DocError, Section, convert
from engine.docs.indexer import Indexer
from engine.docs.retrieve import fts_query, rrf, search
from engine.docs.sources import cited_sources, citations, with_sources
from engine.docs.store import DocStore


# -- chunks -----------------------------------------------------------------------------------

def test_markdown_splits_at_headings_and_keeps_the_trail():
    text = "# Guide\n\nIntro.\n\n## Install\n\nRun it.\n\n### Linux\n\nUse apt.\n\n```\n# not a heading\n```\n"
    chunks = chunk_sections("markdown", [Section(text, "")])
    assert [c.location for c in chunks] == ["Guide", "Guide > Install", "Guide > Install > Linux"]
    assert "# not a heading" in chunks[-1].text


def test_no_chunk_is_longer_than_the_limit_and_none_crosses_a_page():
    long = " ".join(f"Sentence {i} says something about the harbour." for i in range(200))
    chunks = chunk_sections("pdf", [Section(long, "page 1"), Section("Short page.", "page 2")])
    assert all(len(c.text) <= MAX_CHARS for c in chunks)
    assert {c.location for c in chunks} == {"page 1", "page 2"} and chunks[-1].text == "Short page."
    assert " ".join(c.text for c in chunks[:-1]).split() == long.split()  # nothing lost, nothing doubled
    assert all(len(p) <= 50 for p in split_long("x" * 120, 50))


def test_code_splits_at_top_level_definitions_with_their_lines():
    src = "import os\n\n\ndef a():\n    return 1\n\n\n@decorator\ndef b():\n    return 2\n" + "\n" * 3
    src += "".join(f"def f{i}():\n    return {i}\n\n" for i in range(80))
    chunks = chunk_sections("code", [Section(src, "")])
    lines = src.splitlines()
    for c in chunks:
        first, last = map(int, c.location.removeprefix("lines ").split("-"))
        assert c.text == "\n".join(lines[first - 1:last])
    assert len(chunks) > 1 and all(len(c.text) <= MAX_CHARS for c in chunks)
    assert any(c.text.startswith("@decorator\ndef b()") or "\n@decorator\ndef b()" in c.text for c in chunks)


# -- fusion, queries, citations ----------------------------------------------------------------

def test_reciprocal_rank_fusion_favours_agreement():
    fused = dict(rrf([[1, 2, 3], [2, 4, 1]]))
    # 2 (second, first) beats 1 (first, third); each beats what only one ranking has
    assert sorted(fused, key=fused.get, reverse=True) == [2, 1, 4, 3]
    assert dict(rrf([[7], [7]]))[7] == pytest.approx(1.0)  # first everywhere: the top score
    assert rrf([[], []]) == []


def test_a_query_is_never_read_as_fts5_syntax(tmp_path):
    store = DocStore(tmp_path / "d.sqlite3")
    for q in ['"unbalanced', "a AND (b OR", "NEAR(x y)", "col:val*", "^start -minus"]:
        assert store.db.execute("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?",
                                (fts_query(q),)).fetchall() == [(0,)]
    assert fts_query("?!") is None


def test_sources_are_numbered_and_citations_read_back():
    class H:
        filename, location, text = "a.pdf", "page 2", "Quenby kept the light."
    prompt = with_sources("Who kept it?", [H(), H()])
    assert "[1] a.pdf, page 2\nQuenby kept the light." in prompt and prompt.endswith("Question: Who kept it?")
    assert with_sources("Hi", []) == "Hi"
    answer = "Quenby [2]. Also [1, 2] and [7] and [x]."
    assert [n for n, _, _ in citations(answer, 2)] == [2, 1, 2]
    assert cited_sources(answer, 2) == [2, 1]


# -- conversion and its refusals --------------------------------------------------------------

def test_every_format_converts_with_its_locations(tmp_path):
    files = {p.name: p for p in write_corpus(tmp_path)}
    kind, pages = convert(files["lighthouse_report.pdf"])
    assert kind == "pdf" and [s.location for s in pages] == ["page 1", "page 2"] and "Quenby" in pages[1].text
    kind, slides = convert(files["launch_plan.pptx"])
    assert [s.location for s in slides] == ["slide 1", "slide 2", "slide 3"] and "2031" in slides[2].text
    kind, doc = convert(files["garden_notes.docx"])
    assert kind == "markdown" and "# Garden notes" in doc[0].text and "Oolvar" in doc[0].text


def _pdf(path, draw):
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    draw(pdf)
    pdf.output(str(path))
    return path


def test_files_ember_cannot_read_are_refused_in_words(tmp_path):
    def text(pdf):
        pdf.set_font("helvetica", size=11)
        pdf.cell(0, 10, "secret text")

    def locked(pdf):
        text(pdf)
        pdf.set_encryption(owner_password="o", user_password="u")

    cases = {
        "scan.pdf": (_pdf(tmp_path / "scan.pdf", lambda p: p.rect(10, 10, 50, 50, style="F")), "no text layer"),
        "locked.pdf": (_pdf(tmp_path / "locked.pdf", locked), "encrypted"),
        "cut.pdf": (tmp_path / "cut.pdf", "not a readable PDF"),
        "blob.txt": (tmp_path / "blob.txt", "binary"),
        "movie.mkv": (tmp_path / "movie.mkv", "not supported"),
        "gone.md": (tmp_path / "gone.md", "gone"),
        "huge.txt": (tmp_path / "huge.txt", "GiB"),
    }
    whole = (tmp_path / "cut.src.pdf")
    _pdf(whole, text)
    (tmp_path / "cut.pdf").write_bytes(whole.read_bytes()[:200])
    (tmp_path / "blob.txt").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / "movie.mkv").write_bytes(b"x")
    with open(tmp_path / "huge.txt", "wb") as f:  # sparse: 600 MiB of nothing on disk
        f.truncate(600 << 20)
    for name, (path, words) in cases.items():
        with pytest.raises(DocError, match=words) as e:
            convert(path)
        assert name in str(e.value)


def test_text_that_is_not_utf8_is_read_in_its_own_encoding(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_bytes("Café crème à la française, déjà vu: naïve façade près de l'église.".encode("latin-1"))
    assert "Café crème" in convert(p)[1][0].text
    p.write_bytes("Привет, как дела? Это обычный текст на русском языке.".encode("cp1251"))
    assert "обычный текст" in convert(p)[1][0].text


# -- the store and the indexer on the real MiniLM ---------------------------------------------

@pytest.fixture(scope="module")
def embed(tmp_path_factory):
    return minilm_embed(tmp_path_factory.mktemp("minilm"))


def _rows(store: DocStore) -> tuple[int, int, int]:
    vec = sum(store.db.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in store.vec_tables())
    fts = store.db.execute("SELECT count(*) FROM chunks_fts").fetchall()[0][0]
    return store.db.execute("SELECT count(*) FROM chunks").fetchall()[0][0], fts, vec


def test_indexing_is_incremental_and_a_removed_file_leaves_no_chunk(embed, tmp_path):
    fn, name = embed
    store = DocStore(tmp_path / "docs" / "d.sqlite3")
    s = store.create_store("kit")
    ix = Indexer(store, fn, name)
    files = write_corpus(tmp_path / "corpus")
    for p in files:
        assert ix.index(s.id, ix.add_path(s.id, p).id).status == "completed"
    before = store.db.execute("SELECT id FROM chunks ORDER BY id").fetchall()
    n = _rows(store)
    assert n[0] == n[1] == n[2] > len(files)
    assert all(sf.status == "completed" for sf in ix.sync(s.id))
    assert store.db.execute("SELECT id FROM chunks ORDER BY id").fetchall() == before  # nothing re-embedded
    recipes = next(p for p in files if p.name == "recipes.md")
    recipes.write_text("# Recipes\n\nGrandma Irelle's plum cake now needs 410 grams of spelt flour.")
    (tmp_path / "corpus" / "quota.py").unlink()
    ix.sync(s.id)
    assert _rows(store)[0] == _rows(store)[1] == _rows(store)[2] < n[0]
    hit = search(store, [s.id], "plum cake flour", fn(["plum cake flour"])[0], top_k=1)[0]
    assert hit.filename == "recipes.md" and "410 grams" in hit.text
    assert "quota.py" not in {f.filename for f in store.files() if store.store_file(s.id, f.id)}
    store.close()
    again = DocStore(tmp_path / "docs" / "d.sqlite3")  # what was written stays written
    assert search(again, [s.id], "Oolvar seaweed", None, mode="bm25")[0].filename == "garden_notes.docx"


def _indexed_corpus(fn, name: str, tmp_path):
    """(store, collection) with tests/docs_kit.py's corpus indexed by `fn`."""
    store = DocStore(tmp_path / "d.sqlite3")
    s = store.create_store("one")
    ix = Indexer(store, fn, name)
    for p in write_corpus(tmp_path / "c"):
        ix.index(s.id, ix.add_path(s.id, p).id)
    return store, s


def test_the_vectors_are_cosine_neighbours(embed, tmp_path):
    fn, name = embed
    store, s = _indexed_corpus(fn, name, tmp_path)
    q = fn(["Who kept the lighthouse in 1911?"])[0]
    hits = search(store, [s.id], "", q, top_k=50, mode="vector")
    texts = [h.text for h in hits]
    sims = fn(texts) @ q  # numpy's cosine of the same vectors
    assert list(np.argsort(-sims, kind="stable")) == list(range(len(hits)))


def test_a_cancelled_or_failed_indexing_keeps_the_previous_chunks(embed, tmp_path):
    fn, name = embed
    store = DocStore(tmp_path / "d.sqlite3")
    s = store.create_store("one")
    doc = tmp_path / "long.md"
    doc.write_text("\n\n".join(f"## Part {i}\n\nThe tide table for day {i}." for i in range(60)))
    ix = Indexer(store, fn, name, batch=4)
    f = ix.add_path(s.id, doc)
    assert ix.index(s.id, f.id).status == "completed"
    before = _rows(store)
    doc.write_text(doc.read_text() + "\n\n## Extra\n\nMore tides.")
    cancel = threading.Event()
    calls = []

    def embed_then_cancel(texts):
        calls.append(len(texts))
        cancel.set()
        return fn(texts)
    sf = Indexer(store, embed_then_cancel, name, batch=4).index(s.id, f.id, cancel=cancel)
    assert sf.status == "cancelled" and calls == [4] and _rows(store) == before

    def broken(texts):
        raise DocError("the embedder went away")
    assert Indexer(store, broken, name).index(s.id, f.id).status == "failed"
    assert _rows(store) == before


def test_a_new_embedding_model_embeds_the_store_again(embed, tmp_path):
    """The store records the model and dimension that built it; another embedder (a tiny random
    BERT of another width, converted and run as a user's would be) embeds every file again, and
    the old vectors go."""
    from bert_folder_factory import HIDDEN, MAX_POS, write_bert_folder

    from engine.model_files.bert_gguf import convert_bert_folder
    from engine.server.embeddings import Embedder, l2_normalize

    tiny = Embedder(str(convert_bert_folder(write_bert_folder(tmp_path / "bert"), tmp_path / "b.gguf", "f32")), MAX_POS, 1)

    def tiny_embed(texts):
        return np.stack([l2_normalize(tiny.embed(tiny.tokenize(t)[:MAX_POS])) for t in texts])

    fn, name = embed
    store, s = _indexed_corpus(fn, name, tmp_path)
    assert (store.store(s.id).embed_model, store.store(s.id).dim) == (name, 384)
    n = _rows(store)[0]
    done = Indexer(store, tiny_embed, "tiny-bert").sync(s.id)
    assert {sf.embed_model for sf in done} == {"tiny-bert"} and all(sf.status == "completed" for sf in done)
    assert (store.store(s.id).embed_model, store.store(s.id).dim) == ("tiny-bert", HIDDEN)
    assert _rows(store) == (n, n, n)  # the 384-wide vectors are gone, as many of the new ones
    assert store.db.execute("SELECT count(*) FROM vec_384").fetchall() == [(0,)]
    assert len(search(store, [s.id], "lighthouse keeper", tiny_embed(["lighthouse keeper"])[0])) == 5
