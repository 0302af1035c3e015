"""`ember bench rag` on a tiny set (the three shortest of Python's help topics and the tests' own
documents) with the real all-MiniLM-L6-v2: it runs, prints its table and writes its figures. No
speed is asserted; the two sides' vectors must agree (both are llama.cpp on the same file)."""
from __future__ import annotations

import json

import pytest
from docs_kit import QUESTIONS, minilm_store

from app.bench.rag_sets import key_words, prose_sentences, pydoc_set
from app.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_rag_runs_on_a_tiny_set_and_writes_its_figures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    model = minilm_store(tmp_path / "home" / "data" / "models")
    out = tmp_path / "rag.json"
    assert main(["bench", "rag", "--embedding-model", model, "--topics", "3", "--threads", "1",
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "llama-cpp-python Llama.embed" in printed and "hybrid R@5" in printed
    r = json.loads(out.read_text())
    x = r["indexing"]
    assert r["model"] == model and x["set"] == "pydoc" and x["files"] == 3 and x["chunks"] >= 3
    assert x["pipeline_chunks_per_s"] > 0 and x["bare_chunks_per_s"] > 0 and x["max_1_minus_cos"] < 1e-4
    assert 0 < x["pipeline_embed_s"] <= x["pipeline_s"]
    assert set(r["retrieval"]) == {"pydoc", "pydoc-asked", "kit"}
    assert r["retrieval"]["kit"]["questions"] == len(QUESTIONS)
    for figures in r["retrieval"].values():
        for mode in ("hybrid", "vector", "bm25"):
            assert 0 <= figures[mode]["mrr"] <= 1 and 0 <= figures[mode]["recall@5"] <= 1


def test_pydoc_questions_are_a_sentence_of_their_own_topic_in_key_words(tmp_path):
    from pydoc_data.topics import topics

    s = pydoc_set(tmp_path, limit=10)
    assert len(list(tmp_path.iterdir())) == 10 and 5 <= len(s.questions) <= 10
    for q in s.questions:
        name = q.filename.removesuffix(".txt")
        words = q.text.split()
        assert 4 <= len(words) <= 8 and all(w not in {"the", "and", "of", "is"} for w in words)
        assert any(key_words(x) == q.text for x in prose_sentences(topics[name]))


def test_the_written_questions_name_topics_python_ships(tmp_path):
    from pydoc_data.topics import topics

    from app.bench.rag_sets import ASKED, asked_set

    assert len(ASKED) == 30 and all(t in topics for _, t in ASKED)
    assert len(asked_set(pydoc_set(tmp_path)).questions) == 30
