"""A SmolVLM model (an idefics3 projector: an image is its tiles and an overview, each wrapped in
SmolVLM's own tokens) served with --mmproj over real HTTP with the official `openai` client, on
tests/smolvlm_factory.py's tiny random pair: the image is accepted and its tokens counted in the
prompt, the same PNG gives the same log-probabilities again, another image other ones. Random
weights: plumbing, not answer quality."""
from __future__ import annotations

import pytest

from server_util import openai_client, start_engine
from smolvlm_factory import write_tiny_smolvlm
from vision_util import ask, data_uri, image, lps

# SmolVLM2's template, with the content as text (Ember puts each image's marker in it).
SMOLVLM = ("<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}<end_of_utterance>\n"
           "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")


@pytest.fixture(scope="module")
def smolvlm_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smolvlm")
    vlm = write_tiny_smolvlm(tmp, chat_template=SMOLVLM)
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
