"""POST /v1/rerank (and /rerank) over real HTTP against a real engine on the tiny model: documents
ranked by the cosine similarity of their embeddings to the query's, in the Jina/Cohere shape
llama.cpp's server answers.

Oracle we did not write: llama-cpp-python's own `embed()` on the same file (mean-pooled), whose
cosines give the expected scores and order. The answer known in advance: a document that is the
query itself scores 1 and comes first.
"""
from __future__ import annotations

import httpx
import llama_cpp
import numpy as np
import pytest
from server_util import TINY_CTX, start_engine, tiny_model

pytestmark = pytest.mark.slow

QUERY = "The quick brown fox jumps over the lazy dog."
DOCS = ["Ember embeds text.", "Hello world", QUERY, "A lazy dog sleeps in the sun."]


@pytest.fixture(scope="module")
def tiny_path(tiny_model_factory):
    return tiny_model(tiny_model_factory)


@pytest.fixture(scope="module")
def server(tiny_path, tmp_path_factory):
    proc = start_engine(tiny_path, tmp_path_factory.mktemp("srv"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def expected(tiny_path) -> list[float]:
    llm = llama_cpp.Llama(model_path=str(tiny_path), embedding=True, verbose=False, n_ctx=TINY_CTX,
                          pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    unit = [np.asarray(llm.embed(t), dtype=np.float64) for t in (QUERY, *DOCS)]
    llm.close()
    unit = [u / np.linalg.norm(u) for u in unit]
    return [float(d @ unit[0]) for d in unit[1:]]


def _post(server, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120,
                      headers={"Authorization": f"Bearer {server.api_key}"})


def test_documents_come_back_by_similarity_with_the_query_itself_first(server, expected):
    model = server.health()["model"]
    r = _post(server, {"model": model, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == model and body["usage"]["prompt_tokens"] > 0
    results = body["results"]
    assert results[0]["index"] == 2 and results[0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)
    assert [x["index"] for x in results] == sorted(range(len(DOCS)), key=lambda i: -expected[i])
    for x in results:
        assert x["relevance_score"] == pytest.approx(expected[x["index"]], abs=1e-5)
        assert "document" not in x


def test_top_n_return_documents_and_the_short_path(server):
    r = _post(server, {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True}, "/rerank")
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and results[0]["document"] == {"text": QUERY}


def test_bad_requests_are_400s_in_openais_shape_and_the_server_keeps_serving(server):
    for bad in ({"documents": DOCS}, {"query": QUERY}, {"query": QUERY, "documents": []},
                {"query": "", "documents": DOCS}, {"query": QUERY, "documents": DOCS, "top_n": 0},
                {"query": QUERY, "documents": "one document"}, {"query": QUERY, "documents": ["x"] * 300}):
        r = _post(server, bad)
        assert r.status_code == 400 and r.json()["error"]["message"], (bad, r.text)
    r = _post(server, {"model": "no-such-model", "query": QUERY, "documents": DOCS})
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    r = httpx.post(server.base_url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=30)
    assert r.status_code == 401  # the API key, as on every route
    assert _post(server, {"query": QUERY, "documents": DOCS}).status_code == 200
