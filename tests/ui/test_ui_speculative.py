"""Speculative decoding in the GUI: the Settings row, the per-chat toggle and the status bar's acceptance.

The chat tests run the app on a real engine process started with `--speculative ngram` (from the
settings, through `engine_args`) and a fixed 4 drafts a step, so whether it drafts does not hang on
measured costs; the engine's own counters (/v1/engine/status) say which requests it drafted for.
"""
from __future__ import annotations

import json
import re

import pytest
from PySide6.QtWidgets import QDialog

from app.client import EngineClient
from app.gui_main import build_app
from server_util import LONG_CTX
from ui.settings_dialog import SettingsDialog
from ui.speculative_row import EXPLANATION
from ui.status_bar import speculation_text
from ui_support import LONG_KV, app_on, make_settings, replies_ignore_eos, start_engine, ui_settings  # noqa: F401

pytestmark = pytest.mark.timeout(300)

# a reply of 48 tokens however the tiny model's EOS falls; greedy, so both chats get the same text
GREEDY = {"temperature": 0.0, "max_tokens": 48}
PROMPT = "Repeat after me: the quick brown fox, the quick brown fox, the quick brown fox."
MODELS = [("tiny-draft", "Tiny Draft"), ("qwen2.5-coder-0.5b", "Qwen2.5 Coder 0.5B Instruct")]


def test_settings_row_edits_the_setting(qtbot, ui_settings):  # noqa: F811
    dialog = SettingsDialog(ui_settings, models=MODELS)
    qtbot.addWidget(dialog)
    dialog.show()
    row = dialog.speculative
    assert row.mode.currentText() == "Off" and row.value() == "off"
    assert row.note.text() == EXPLANATION and row.note.isVisible()
    assert not row.draft.isVisible(), "no draft picker unless a draft model is chosen"
    row.mode.setCurrentText("Prompt lookup")
    dialog.accept()
    assert dialog.result() == QDialog.DialogCode.Accepted
    assert json.loads(ui_settings.path.read_text())["speculative"] == "ngram" == ui_settings.speculative

    again = SettingsDialog(ui_settings, models=MODELS)
    qtbot.addWidget(again)
    again.show()
    assert again.speculative.mode.currentText() == "Prompt lookup"
    again.speculative.mode.setCurrentText("Draft model")
    assert again.speculative.draft.isVisible() and again.speculative.browse.isVisible()
    assert [again.speculative.draft.itemText(i) for i in range(2)] == ["Tiny Draft", "Qwen2.5 Coder 0.5B Instruct"]
    again.speculative.draft.setCurrentIndex(1)
    again.accept()
    assert ui_settings.speculative == "qwen2.5-coder-0.5b"
    assert json.loads(ui_settings.path.read_text())["speculative"] == "qwen2.5-coder-0.5b"


def test_a_draft_model_that_is_not_installed_stays_shown(qtbot, ui_settings):  # noqa: F811
    ui_settings.speculative = "/models/Old-Draft.Q4_K.gguf"
    dialog = SettingsDialog(ui_settings, models=MODELS)
    qtbot.addWidget(dialog)
    row = dialog.speculative
    assert row.mode.currentText() == "Draft model" and row.draft.currentText() == "Old-Draft.Q4_K.gguf"
    assert row.value() == "/models/Old-Draft.Q4_K.gguf"


def test_draft_model_without_a_model_is_refused(qtbot, ui_settings):  # noqa: F811
    dialog = SettingsDialog(ui_settings, models=[])
    qtbot.addWidget(dialog)
    dialog.speculative.mode.setCurrentText("Draft model")
    dialog.accept()
    assert dialog.result() != QDialog.DialogCode.Accepted
    assert "speculative" in dialog.error.text() and "draft model" in dialog.error.text()
    assert ui_settings.speculative == "off"


def test_status_text_only_once_drafts_were_checked():
    assert speculation_text(None) == "" and speculation_text({}) == ""
    assert speculation_text({"drafter": "ngram", "draft_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None}) == ""
    assert speculation_text({"drafter": "ngram", "draft_tokens": 50, "accepted_tokens": 36,
                             "acceptance_rate": 0.72}) == "drafts 72% accepted"


@pytest.fixture(scope="module")
def ngram_engine(tmp_path_factory, tiny_model_factory):
    settings = make_settings(tmp_path_factory.mktemp("ngram-engine"), speculative="ngram")
    sup = start_engine(settings, tiny_model_factory(ctx=LONG_CTX),
                       extra_args=(*LONG_KV, "--num-speculative-tokens", "4"))
    yield sup
    sup.stop()


@pytest.fixture
def ember(qtbot, tmp_path, ngram_engine):
    with app_on(qtbot, make_settings(tmp_path / "app", speculative="ngram"), ngram_engine) as app:
        yield app


def drafted(client: EngineClient) -> int:
    return client.status()["speculative"]["draft_tokens"]


def test_chat_toggle_off_sends_speculative_off_and_status_shows_acceptance(qtbot, ember, monkeypatch):
    replies_ignore_eos(monkeypatch)
    client = EngineClient(ember.controller.base_url, api_key=ember.controller.api_key)
    panel, status = ember.window.settings_panel, ember.window.status
    before = drafted(client)

    on = ember.window.new_chat()
    ember.chat_store.update_chat_settings(on.chat_id, GREEDY)
    qtbot.waitUntil(panel.speculative.isEnabled, timeout=10_000)  # the engine said it speculates
    assert panel.speculative.isChecked(), "a chat speculates unless it opts out"
    with qtbot.waitSignal(on.reply_finished, timeout=120_000) as done:
        on.send(PROMPT)
    assert done.args == [on.chat_id, "done"], on.transcript.messages[-1].error
    after_on = drafted(client)
    assert after_on > before, "the chat with speculation on should have had drafts checked"
    qtbot.waitUntil(lambda: "accepted" in status.spec_label.text(), timeout=10_000)
    assert re.fullmatch(r"drafts \d+% accepted", status.spec_label.text())
    assert "prompt lookup" in status.spec_label.toolTip()

    off = ember.window.new_chat()
    ember.chat_store.update_chat_settings(off.chat_id, GREEDY)
    ember.window.open_chat(off.chat_id)
    panel.speculative.click()  # as the user does: untick "Speculative decoding" in the chat's panel
    assert ember.chat_store.get_chat(off.chat_id).settings["speculative"] is False
    with qtbot.waitSignal(off.reply_finished, timeout=120_000) as done:
        off.send(PROMPT)
    assert done.args == [off.chat_id, "done"], off.transcript.messages[-1].error
    assert drafted(client) == after_on, "the chat with speculation off sent drafts to check"
    assert off.transcript.messages[-1].content == on.transcript.messages[-1].content, "the reply is the same"

    # the choice is the chat's own: the panel shows each chat's when it is opened
    ember.window.open_chat(on.chat_id)
    assert panel.speculative.isChecked()
    ember.window.open_chat(off.chat_id)
    assert not panel.speculative.isChecked()


def test_status_bar_figures_fit_beside_a_long_model_name(qtbot, tmp_path):
    """At the window's default size every figure is whole; the model's name is what gets shortened."""
    app = build_app(make_settings(tmp_path / "app"))
    qtbot.addWidget(app.window)
    app.window.resize(1100, 720)
    app.window.show()
    bar = app.window.status
    bar._on_status_changed({"status": "ready", "model": "smollm2-135m-8k-lc100k-mix1-ep2-instruct-q4_1",
                            "backend": "torch", "device": "cpu", "num_running": 1, "generation_tok_s": 7.0,
                            "kv": {"blocks_used": 10, "blocks_total": 2912},
                            "speculative": {"drafter": "ngram", "draft_tokens": 400, "accepted_tokens": 128,
                                            "acceptance_rate": 0.32, "tokens_per_target_pass": 1.9,
                                            "draft_seconds": 0.01, "verify_seconds": 3.2}})
    qtbot.wait(50)  # one layout pass
    assert bar.spec_label.text() == "drafts 32% accepted" and "128 of 400" in bar.spec_label.toolTip()
    for label in (bar.device_label, bar.state_label, bar.spec_label, bar.kv_label):
        assert label.isVisible() and label.width() >= label.fontMetrics().horizontalAdvance(label.text()), \
            f"{label.text()!r} is cut to {label.width()} px"
    assert bar.model_label.width() > 0 and "smollm2-135m-8k" in bar.model_label.toolTip()
    app.chat_store.close()


def test_changing_it_in_settings_asks_for_an_engine_restart(qtbot, tmp_path):
    """Like every engine setting: saved, and the status bar says how it takes effect."""
    app = build_app(make_settings(tmp_path / "app"))
    qtbot.addWidget(app.window)
    app.window.show()
    dialog = app.open_settings(app.window)
    assert dialog.speculative.draft.count() == len(app.store.list())  # the installed models to draft with
    dialog.speculative.mode.setCurrentText("Prompt lookup")
    dialog.accept()
    assert app.settings.speculative == "ngram"
    assert "Restart engine" in app.window.status.currentMessage()
    app.chat_store.close()
