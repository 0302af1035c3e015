"""Speculative decoding through `ember serve` (issue 14), over real HTTP with the official openai
client: the same greedy reply with drafts and with "speculative": "off", the draft counts in the
usage (OpenAI's predicted-output fields), and the engine-wide counters in status and /metrics."""
from __future__ import annotations

import httpx
import pytest
from server_util import openai_client, start_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = ("Repeat this list exactly, then stop: apple, banana, cherry, date, elderberry, fig, grape, "
          "apple, banana, cherry, date, elderberry, fig, grape.")


@pytest.fixture(scope="module")
def server(bundled_model_path, tmp_path_factory):
    proc = start_engine(bundled_model_path, tmp_path_factory.mktemp("spec"), "--speculative", "ngram",
                        "--num-speculative-tokens", "4", backend="torch")
    yield proc
    proc.stop()


def test_replies_are_the_same_with_and_without_drafts(server):
    client = openai_client(server)
    ask = dict(model="default", messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=48)
    spec = client.chat.completions.create(**ask)
    plain = client.chat.completions.create(**ask, extra_body={"speculative": "off"})
    assert spec.choices[0].message.content == plain.choices[0].message.content
    details = spec.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens > 0
    assert plain.usage.completion_tokens_details is None  # no drafts for that request
    status = httpx.get(server.base_url + "/v1/engine/status", headers=server.headers).json()["speculative"]
    assert status["drafter"] == "ngram" and status["accepted_tokens"] >= details.accepted_prediction_tokens
    metrics = httpx.get(server.base_url + "/metrics", headers=server.headers).text
    assert "ember_speculative_accepted_tokens" in metrics


def test_a_bad_speculative_value_is_a_400(server):
    r = httpx.post(server.base_url + "/v1/chat/completions", headers=server.headers,
                   json={"messages": [{"role": "user", "content": "hi"}], "speculative": "sometimes"})
    assert r.status_code == 400
