"""A SmolVLM model (an idefics3 projector: an image is its tiles and an overview, each wrapped in
SmolVLM's own tokens) served with --mmproj over real HTTP with the official `openai` client, on
tests/smolvlm_factory.py's tiny random pair with SmolVLM2's own chat template (which reads content
only as typed parts): the image is accepted and its tokens counted in the
prompt, the same PNG gives the same log-probabilities again, another image other ones. Random
weights: plumbing, not answer quality."""
from __future__ import annotations

import pytest

from server_util import openai_client, start_engine
from smolvlm_factory import SMOLVLM2_TEMPLATE, write_tiny_smolvlm
from vision_util import ask, data_uri, image, lps



@pytest.fixture(scope="module")
def smolvlm_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smolvlm")
    vlm = write_tiny_smolvlm(tmp, chat_template=SMOLVLM2_TEMPLATE)  # its real one: typed content parts
    proc = start_engine(vlm.model, tmp, "--mmproj", str(vlm.mmproj), backend="llama.cpp")
    yield proc, vlm
    proc.stop()


def test_a_smolvlm_image_is_seen_counted_and_the_same_bits_again(smolvlm_server):
    proc, vlm = smolvlm_server
    client = openai_client(proc)
    plain = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": "What is in this picture?"}])
    a = ask(client, image(data_uri(1)))
    assert a.usage.prompt_tokens >= plain.usage.prompt_tokens + vlm.image_tokens + 13  # and its 13 wrapper tokens
    assert lps(ask(client, image(data_uri(1)))) == lps(a)
    assert lps(ask(client, image(data_uri(2)))) != lps(a)
