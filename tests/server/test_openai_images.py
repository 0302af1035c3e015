"""OpenAI `image_url` parts on /v1/chat/completions over real HTTP with the official client, on
tests/vlm_factory.py's tiny random vision model served with --mmproj (`python -m engine serve`,
the llama.cpp backend): an image is accepted and counted in the prompt's tokens, the same PNG
twice gives the same log-probabilities, another image other ones; every bad input is a 400 in
OpenAI's shape naming the part (an http URL, a URI that is not base64 data, bytes that are no
image), and a model served without a projector refuses an image the same way. The Responses API's
input_image and Anthropic's image blocks (and their count_tokens) take the same path. Random
weights: plumbing, not answer quality."""
from __future__ import annotations

import base64

import openai
import pytest

from server_util import openai_client, start_engine, tiny_model
from vision_util import GEMMA_TEMPLATE, ask, data_uri, image, lps, png_bytes, responses_input
from vlm_factory import write_tiny_vlm


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vision")
    vlm = write_tiny_vlm(tmp, chat_template=GEMMA_TEMPLATE)
    proc = start_engine(vlm.model, tmp, "--mmproj", str(vlm.mmproj), backend="llama.cpp")
    yield proc, vlm
    proc.stop()


def test_an_image_is_seen_and_its_pixels_decide_the_logits(vision_server):
    proc, vlm = vision_server
    client = openai_client(proc)
    plain = client.chat.completions.create(model="lm", max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}])
    a = ask(client, image(data_uri(1)))
    assert a.usage.prompt_tokens >= plain.usage.prompt_tokens + vlm.image_tokens
    assert lps(ask(client, image(data_uri(1)))) == lps(a)  # the same bits
    assert lps(ask(client, image(data_uri(2)))) != lps(a)


@pytest.mark.parametrize("url, says", [
    ("https://example.com/cat.png", "is not fetched unless the server allows it (the setting fetch_image_urls"),
    ("data:image/png,not-base64", "not a base64 data: URI"),
    ("data:image/png;base64,@@@@", "base64 does not decode"),
    ("data:image/png;base64," + base64.b64encode(b"no picture here").decode(), "not an image"),
])
def test_a_bad_image_part_is_a_400_naming_it(vision_server, url, says):
    client = openai_client(vision_server[0])
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, image(data_uri(1)), image(url))
    err = e.value.body
    assert err["param"] == "messages[0].content[2]" and says in err["message"]


def test_a_model_without_a_projector_refuses_an_image(tmp_path, tiny_model_factory):
    proc = start_engine(tiny_model(tiny_model_factory), tmp_path, backend="llama.cpp")
    try:
        with pytest.raises(openai.BadRequestError) as e:
            ask(openai_client(proc), image(data_uri(1)))
        assert e.value.body["param"] == "messages[0].content[1]"
        assert "cannot see images" in e.value.body["message"]
    finally:
        proc.stop()


def test_ollamas_images_reach_the_same_path(vision_server):
    """Ollama's `images` (the official client base64s them) are the message's image parts: the same
    picture gives the same reply as through OpenAI's shape, and a broken one is Ollama's 400."""
    import ollama

    proc, vlm = vision_server
    client = ollama.Client(host=proc.base_url, headers={"Authorization": f"Bearer {proc.api_key}"}, timeout=120)
    opts = {"num_predict": 3, "temperature": 0}
    a = client.chat("lm", messages=[{"role": "user", "content": "What?", "images": [png_bytes(1)]}], options=opts)
    b = client.chat("lm", messages=[{"role": "user", "content": "What?", "images": [png_bytes(2)]}], options=opts)
    again = client.chat("lm", messages=[{"role": "user", "content": "What?", "images": [png_bytes(1)]}], options=opts)
    assert a.message.content == again.message.content
    assert a.prompt_eval_count >= vlm.image_tokens and a.prompt_eval_count == b.prompt_eval_count
    g = client.generate("lm", prompt="What?", images=[png_bytes(1)], options=opts)
    assert g.prompt_eval_count >= vlm.image_tokens
    with pytest.raises(ollama.ResponseError) as e:
        client.chat("lm", messages=[{"role": "user", "content": "What?", "images": [b"no picture"]}])
    assert e.value.status_code == 400 and "not an image" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.generate("lm", prompt="What?", raw=True, images=[png_bytes(1)])
    assert e.value.status_code == 400 and "raw" in e.value.error
    assert "vision" in client.show("lm").capabilities  # as Ollama says of a model that sees


def test_anthropics_image_blocks_reach_the_same_path(vision_server):
    """Anthropic's base64 `image` blocks are image parts where they stand; a url source is refused
    as OpenAI's http URL is, a broken image is Anthropic's 400."""
    import anthropic

    proc, vlm = vision_server
    client = anthropic.Anthropic(base_url=proc.base_url, api_key=proc.api_key, max_retries=0, timeout=120)

    def ask_claude(source: dict):
        block = {"type": "image", "source": source}
        return client.messages.create(model="lm", max_tokens=2, messages=[
            {"role": "user", "content": [block, {"type": "text", "text": "What?"}]}])

    png = base64.b64encode(png_bytes(1)).decode()
    r = ask_claude({"type": "base64", "media_type": "image/png", "data": png})
    assert r.usage.input_tokens >= vlm.image_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        ask_claude({"type": "url", "url": "https://example.com/cat.png"})
    assert "is not fetched unless the server allows it (the setting fetch_image_urls" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        ask_claude({"type": "base64", "media_type": "image/png", "data": base64.b64encode(b"nope").decode()})
    assert e.value.body["error"]["type"] == "invalid_request_error" and "not an image" in e.value.body["error"]["message"]


def test_the_next_turn_about_a_picture_starts_from_its_cached_cells(vision_server):
    """A chat's second turn sends the picture again: its cells are the prompt cache's (the image's
    placeholder ids are its pixels' hash), so the turn is not computed, nor encoded, again."""
    proc, vlm = vision_server
    client = openai_client(proc)
    turn = [{"role": "user", "content": [image(data_uri(9)), {"type": "text", "text": "What is it?"}]}]
    first = client.chat.completions.create(model="lm", messages=turn, max_tokens=3, temperature=0)
    turn += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And its colour?"}]
    second = client.chat.completions.create(model="lm", messages=turn, max_tokens=3, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= vlm.image_tokens
    other = [{"role": "user", "content": [image(data_uri(10)), {"type": "text", "text": "What is it?"}]}]
    third = client.chat.completions.create(model="lm", messages=other, max_tokens=3, temperature=0)
    hit = second.usage.prompt_tokens_details.cached_tokens
    # other pixels: only the text before the image matches, never part of the image
    assert (third.usage.prompt_tokens_details.cached_tokens or 0) + vlm.image_tokens <= hit


def test_an_image_and_documents_in_one_turn_keep_both(tmp_path):
    """A turn with a picture that also asks the documents: the passages go before the text and the
    image stays where it was (the prompt grows by the passages, the image still counts)."""
    from docs_kit import minilm_store

    vlm = write_tiny_vlm(tmp_path, chat_template=GEMMA_TEMPLATE)
    minilm_store(tmp_path / "models")
    proc = start_engine(vlm.model, tmp_path, "--mmproj", str(vlm.mmproj), "--models-dir", str(tmp_path / "models"),
                        "--docs-dir", str(tmp_path / "docs"), backend="llama.cpp")
    try:
        client = openai_client(proc)
        (tmp_path / "note.md").write_text("# Note\n\nThe red kite nests in the old oak by the mill.")
        f = client.files.create(file=open(tmp_path / "note.md", "rb"), purpose="assistants")
        store = client.vector_stores.create(name="birds")
        client.vector_stores.files.create_and_poll(vector_store_id=store.id, file_id=f.id, poll_interval_ms=100)
        turn = {"model": vlm.model.name, "max_tokens": 2, "temperature": 0, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Where does the red kite nest?"}, image(data_uri(1))]}]}
        words = {**turn, "messages": [{"role": "user", "content": "Where does the red kite nest?"}]}
        docs = {"documents": {"vector_store_ids": [store.id]}}
        n = {name: client.chat.completions.create(**t, extra_body=e).usage.prompt_tokens
             for name, t, e in (("image", turn, {}), ("words", words, {}), ("words+docs", words, docs))}
        both = client.chat.completions.create(**turn, extra_body=docs)
        assert both.model_extra["sources"][0]["file_id"] == f.id
        image_tokens = n["image"] - n["words"]
        assert image_tokens >= 16 and both.usage.prompt_tokens == n["words+docs"] + image_tokens
    finally:
        proc.stop()


def test_a_vision_model_served_from_the_store_gets_its_projector(tmp_path):
    """`ember models import lm.gguf --mmproj mmproj.gguf`, then the server on the store's id (no
    --mmproj): the manifest's pairing loads the projector, and an image is seen."""
    import secrets

    from app.engine_process import EngineProcess
    from app.store import ModelStore

    vlm = write_tiny_vlm(tmp_path / "files", chat_template=GEMMA_TEMPLATE)
    ModelStore(tmp_path / "models").import_path(vlm.model, model_id="eye", mmproj=vlm.mmproj)
    proc = EngineProcess(["--models-dir", str(tmp_path / "models"), "--model-id", "eye", "--backend", "llama.cpp",
                          "--threads", "1", "--num-kv-blocks", "512"], api_key=secrets.token_urlsafe(16),
                         log_path=tmp_path / "engine.log").start(timeout=240)
    try:
        r = ask(openai_client(proc), image(data_uri(1)))
        assert r.usage.prompt_tokens >= vlm.image_tokens
    finally:
        proc.stop()


def test_responses_input_image_takes_the_same_path(vision_server):
    """The Responses API's `input_image` (a data: URI) is the chat's image part: the same prompt
    tokens and the same greedy reply as /v1/chat/completions with the same picture."""
    proc, vlm = vision_server
    client = openai_client(proc)
    r = client.responses.create(model="lm", input=responses_input({"type": "input_image", "image_url": data_uri(1)}),
                                max_output_tokens=2, temperature=0)
    chat = client.chat.completions.create(model="lm", max_tokens=2, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, image(data_uri(1))]}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens >= vlm.image_tokens
    assert r.output_text == chat.choices[0].message.content
    other = client.responses.create(model="lm", input=responses_input({"type": "input_image", "image_url": data_uri(2)}),
                                    max_output_tokens=2, temperature=0)
    assert other.usage.input_tokens == r.usage.input_tokens


@pytest.mark.parametrize("part, says", [
    ({"image_url": "https://example.com/cat.png"}, "the setting fetch_image_urls"),
    ({"image_url": "data:image/png;base64,@@@@"}, "base64 does not decode"),
    ({"image_url": "data:image/png;base64," + base64.b64encode(b"no picture here").decode()}, "not an image"),
    ({"file_id": "file-abc"}, "this server keeps no files"),
    ({"detail": "auto"}, "needs an image_url"),
])
def test_a_bad_input_image_is_a_400_naming_it(vision_server, part, says):
    client = openai_client(vision_server[0])
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="lm", input=responses_input({"type": "input_image", **part}), max_output_tokens=2)
    err = e.value.body
    assert err["param"] == "input[0].content[1]" and says in err["message"], err


def test_anthropic_count_tokens_counts_the_images(vision_server):
    """count_tokens with an image block: the image's tokens are counted, as /v1/messages uses them."""
    import anthropic

    proc, vlm = vision_server
    client = anthropic.Anthropic(base_url=proc.base_url, api_key=proc.api_key, max_retries=0, timeout=120)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png_bytes(1)).decode()}}
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "What?"}]}]
    counted = client.messages.count_tokens(model="lm", messages=messages).input_tokens
    plain = client.messages.count_tokens(model="lm", messages=[{"role": "user", "content": "What?"}]).input_tokens
    assert counted >= plain + vlm.image_tokens
    assert counted == client.messages.create(model="lm", max_tokens=1, messages=messages).usage.input_tokens
