"""A chat template the user sets for an installed model (the model manager's "Chat template…"):
kept next to its manifest, refused when it does not compile, used wherever the model loads (the
engine's store, Ollama's /api/show, `ember generate --model ID`), and reasoning is read from the
template in use. The model is scripted (tests/scripted_gguf.py): its reply is always
`<think>\\thm</think> ok`, split into reasoning and answer only under a template that knows
<think>; under a plain ChatML template the same reply is all content.
"""
from __future__ import annotations

import hashlib

import pytest
from gguf_factory import CHATML_TEMPLATE
from scripted_gguf import write_scripted_model
from server_util import openai_client

from app.engine_process import EngineProcess

from app.cli_chat import installed_template
from app.store import ModelStore
from ui.installed_table import InstalledTable
from ui_support import make_settings

SCRIPT = ["<think>", "ĉ", "h", "m", "</think>", "Ġ", "o", "k"]
MSGS = [{"role": "user", "content": "Say ok."}]


@pytest.fixture
def store(tmp_path):
    path = write_scripted_model(tmp_path / "thinker.gguf", SCRIPT)
    s = ModelStore(tmp_path / "models")
    s.import_path(path, model_id="thinker")
    return s


def test_the_store_keeps_a_template_that_compiles(store, tmp_path):
    assert store.chat_template("thinker") is None
    store.set_chat_template("thinker", CHATML_TEMPLATE)
    assert store.chat_template("thinker") == CHATML_TEMPLATE
    with pytest.raises(ValueError, match="line 1"):
        store.set_chat_template("thinker", "{% for m in messages %}{{ m.content }")
    assert store.chat_template("thinker") == CHATML_TEMPLATE  # a refused one changes nothing
    with pytest.raises(ValueError, match="empty"):
        store.set_chat_template("thinker", "  \n")
    with pytest.raises(KeyError):
        store.set_chat_template("nope", CHATML_TEMPLATE)
    store.set_chat_template("thinker", None)
    assert store.chat_template("thinker") is None


def _serve(store: ModelStore, tmp_path) -> EngineProcess:
    """An engine serving the installed model by its id, as the desktop app starts one."""
    return EngineProcess(["--model-id", "thinker", "--models-dir", str(store.root), "--backend", "torch",
                          "--threads", "1", "--num-kv-blocks", "256"], api_key="k",
                         log_path=tmp_path / "engine.log").start(timeout=240)


@pytest.mark.slow
def test_the_engine_uses_the_installed_template_and_reads_reasoning_from_it(store, tmp_path, monkeypatch):
    proc = _serve(store, tmp_path)
    try:
        split = openai_client(proc).chat.completions.create(model="thinker", messages=MSGS, temperature=0,
                                                            max_tokens=20).choices[0].message
        assert (split.model_extra["reasoning_content"], split.content) == ("hm", "ok")
    finally:
        proc.stop()
    store.set_chat_template("thinker", CHATML_TEMPLATE)  # no <think> in it: the reply is all answer
    proc = _serve(store, tmp_path)
    try:
        plain = openai_client(proc).chat.completions.create(model="thinker", messages=MSGS, temperature=0,
                                                            max_tokens=20).choices[0].message
        assert plain.content == "<think>\thm</think> ok" and not (plain.model_extra or {}).get("reasoning_content")
        import httpx
        shown = httpx.post(proc.base_url + "/api/show", json={"model": "thinker"},
                           headers={"Authorization": f"Bearer {proc.api_key}"}).json()
        assert shown["template"] == CHATML_TEMPLATE
    finally:
        proc.stop()
    monkeypatch.setenv("EMBER_MODELS_DIR", str(store.root))
    assert installed_template("thinker") == str(store.root / "thinker" / "chat_template.jinja")
    assert installed_template(store.get("thinker").path) is None  # a path names no installed model


def test_the_model_manager_sets_and_resets_it(qtbot, store, tmp_path):
    settings = make_settings(tmp_path / "ember")
    table = InstalledTable(store, settings)
    qtbot.addWidget(table)
    good, bad = tmp_path / "chatml.jinja", tmp_path / "broken.jinja"
    good.write_text(CHATML_TEMPLATE, encoding="utf-8")
    bad.write_text("{{ unclosed", encoding="utf-8")
    table.select("thinker")
    assert not table.reset_template_button.isEnabled()
    assert not table.set_chat_template("thinker", bad) and "does not compile" in table.message.text()
    assert table.set_chat_template("thinker", good) and "chatml.jinja" in table.message.text()
    assert "custom chat template" in table.table.item(0, 0).text()
    table.select("thinker")
    assert table.reset_template_button.isEnabled()
    table.reset_template_button.click()
    assert store.chat_template("thinker") is None and "custom chat template" not in table.table.item(0, 0).text()
    assert hashlib.sha256(good.read_bytes()).hexdigest()  # the user's file is left as it was
