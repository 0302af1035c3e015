"""A Qwen2.5-VL model (M-RoPE: an image takes fewer positions than tokens) served with --mmproj over
real HTTP with the official `openai` client, on tests/vlm_factory.py's tiny random qwen2vl LM and
qwen2.5vl_merger projector: the image is accepted and its tokens counted in the prompt, the same PNG
gives the same log-probabilities twice and on a later turn (the prefix cache's cells, at the shifted
positions), another image other ones. Random weights: plumbing, not answer quality."""
from __future__ import annotations

import pytest

from server_util import openai_client, start_engine
from vision_util import ask, data_uri, image, lps
from vlm_factory import write_tiny_qwen2vl

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qwen-vl")
    vlm = write_tiny_qwen2vl(tmp, chat_template=CHATML)
    proc = start_engine(vlm.model, tmp, "--mmproj", str(vlm.mmproj), backend="llama.cpp")
    yield proc, vlm
    proc.stop()


def test_a_qwen25_vl_image_is_seen_counted_and_the_same_bits_again(qwen_server):
    proc, vlm = qwen_server
    client = openai_client(proc)
    plain = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=2, temperature=0,
                                           messages=[{"role": "user", "content": "What is in this picture?"}])
    a = ask(client, image(data_uri(1)))
    assert a.usage.prompt_tokens >= plain.usage.prompt_tokens + vlm.image_tokens
    assert lps(ask(client, image(data_uri(1)))) == lps(a)  # again: the slot's cells, no new encode
    assert lps(ask(client, image(data_uri(2)))) != lps(a)
