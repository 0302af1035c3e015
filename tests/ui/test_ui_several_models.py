"""The window with several models loaded at once (issue 63), on real widgets offscreen fed the status
bodies Ember's engine answers (`models`, `queue`, `memory`) and the ones a remote server answers (none
of those keys): the status bar names every loaded model and marks the chat's, a reply that has not begun
says it waits for memory or a load, the Installed tab marks every loaded model and offers Unload."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.client import EngineClientError
from app.gui_main import build_app
from app.store import ModelStore
from ui.error_words import load_failure_words, reply_error_text
from ui.installed_table import InstalledTable
from ui.pending_reply import PendingReply
from ui.resident_models import memory_line, models_line, models_tooltip, pending_words, resident, short_name
from ui.status_bar import busy_text
from ui.status_poll import IDLE_POLL_FACTOR, engine_idle
from ui.transcript import TranscriptView
from ui.transcript_message import TranscriptMessage
from ui_support import make_settings

GIB = 2**30
NAMES = {"smollm2": "SmolLM2", "qwen": "Qwen 0.5B", "phi": "Phi mini"}


def model(model_id: str, state: str = "ready", running: int = 0, **kw) -> dict:
    return {"id": model_id, "name": NAMES[model_id], "state": state, "backend": "torch", "device": "cpu",
            "bytes": GIB // 2, "weight_bytes": GIB // 4, "kv_bytes": GIB // 4, "running": running,
            "expires_at": None, "embeds_only": False, "completion_only": False, **kw}


def several(*models: dict, queue: list[dict] | None = None) -> dict:
    """A /v1/engine/status body of the engine that holds several models (the top level: the first's)."""
    return {"status": "ready", "model": models[0]["id"] if models else None, "backend": "torch", "device": "cpu",
            "num_running": models[0]["running"] if models else 0, "num_waiting": 0, "generation_tok_s": 0.0,
            "models": list(models), "queue": queue or [],
            "memory": {"budget_bytes": 2 * GIB, "used_bytes": GIB, "rss_bytes": GIB + GIB // 4, "max_models": 3}}


REMOTE = {"status": "ready", "model": "qwen", "remote": True}  # what a vLLM or llama-server status becomes


def test_the_words_for_a_reply_that_waits():
    status = several(model("smollm2", running=2), queue=[{"model": "qwen", "position": 1, "waiting_s": 2.0},
                                                         {"model": "phi", "position": 3, "waiting_s": 0.5}])
    assert pending_words(status, "qwen", NAMES) == "Waiting for memory: next in line"
    assert pending_words(status, "phi", NAMES) == "Waiting for memory: 2 ahead"
    assert pending_words(status, "smollm2", NAMES) == ""  # loaded and serving: its reply just has not begun
    loading = several(model("smollm2"), model("qwen", state="loading"))
    assert pending_words(loading, "qwen", NAMES) == "Loading Qwen 0.5B…"
    assert pending_words(REMOTE, "qwen", NAMES) == "" and pending_words({}, None, NAMES) == ""


def test_a_chats_model_that_cannot_load_or_wait_says_so_in_words():
    refused = EngineClientError("loading beta failed: beta.gguf: truncated; alpha is still loaded", 400,
                                code="model_load_failed")
    assert reply_error_text(refused, remote=False) == ("Could not load beta: beta.gguf: truncated. alpha is still "
                                                       "loaded. Choose another model in the picker, then press "
                                                       "Regenerate.")
    both = EngineClientError("loading beta failed: too big; alpha, gamma, delta are still loaded", 400)
    assert load_failure_words("beta", both) == "Could not load beta: too big. alpha, gamma and delta are still loaded."
    full = EngineClientError("too many requests wait for memory", 503, code="queue_full")
    assert "Regenerate in a moment" in reply_error_text(full, remote=False)


def test_the_status_bars_words_for_several_models_and_for_a_remote_server():
    status = several(model("smollm2", running=1, expires_at=1000.0 + 300), model("qwen", state="loading"),
                     queue=[{"model": "phi", "position": 1, "waiting_s": 1.0}])
    assert models_line(status, NAMES, "smollm2") == "SmolLM2 (this chat) · Qwen 0.5B (loading…)"
    tip = models_tooltip(status, NAMES, [("Fox story", "smollm2"), ("Code", None), ("Sums", "qwen")], now=1000.0)
    assert "SmolLM2 (smollm2): 512 MiB (weights 256 MiB, chat memory 256 MiB), writing 1 reply" in tip
    assert "used by: Fox story, Code" in tip and "used by: Sums" in tip  # a chat without its own: the most recent
    assert "unloads in 5 min if left idle" in tip and tip.count("unloads") == 1
    assert tip.endswith("Phi mini: waiting for memory, 1 in line")
    assert [short_name(n) for n in ("SmolLM2 135M Instruct (Q4_1)", "Qwen2.5 Coder 0.5B Instruct AWQ",
                                    "gemma-3-270m-it Q4_K_M", "Chatty")] == \
        ["SmolLM2 135M", "Qwen2.5 Coder 0.5B", "gemma-3-270m", "Chatty"]
    twins = {"smollm2": "Twin (Q4_1)", "qwen": "Twin (Q8_0)"}  # short names that would look alike stay whole
    assert models_line(several(model("smollm2"), model("qwen")), twins, None) == "Twin (Q4_1) · Twin (Q8_0)"
    assert memory_line(status)[0] == "Models 1.0 GiB of 2.0 GiB" and "at most 3 models" in memory_line(status)[1]
    assert busy_text(status) == "Writing a reply · 1 waiting for memory"
    assert busy_text(several(model("smollm2", running=1), model("qwen", running=2))) == "Writing 3 replies"
    # a server without these keys: today's line, no memory figure
    assert models_line(REMOTE, NAMES, "smollm2") == "Model: Qwen 0.5B" and memory_line(REMOTE) == ("", "")
    assert [m["id"] for m in resident(REMOTE)] == ["qwen"] and resident({"status": "error", "model": "x"}) == []
    # the poll stays short while anything waits or loads, on any model
    assert engine_idle(several(model("smollm2"), model("qwen")))
    assert not engine_idle(several(model("smollm2"), model("qwen", running=1)))
    assert not engine_idle(status) and not engine_idle(several(model("smollm2"), model("qwen", state="loading")))


@pytest.fixture
def app(qtbot, tmp_path):
    ember = build_app(make_settings(tmp_path / "app"))  # no engine started: the status bodies are fed in
    qtbot.addWidget(ember.window)
    ember.controller.model_names = dict(NAMES)
    yield ember
    ember.controller.close()
    ember.chat_store.close()


def test_the_status_bar_marks_the_chat_in_views_model_and_says_the_memory(app):
    window, bar, controller = app.window, app.window.status, app.controller
    fox = window.new_chat()
    app.chat_store.rename_chat(fox.chat_id, "Fox story")
    app.chat_store.set_chat_model(fox.chat_id, "smollm2")
    code = window.new_chat()
    app.chat_store.rename_chat(code.chat_id, "Code")
    app.chat_store.set_chat_model(code.chat_id, "qwen")
    window.open_chat(code.chat_id)
    controller._on_status(several(model("smollm2", running=1), model("qwen")))
    assert controller.current_model == "qwen" and controller.serving_model == "smollm2"
    assert bar.model_label.text() == "SmolLM2 · Qwen 0.5B (this chat)"
    assert "used by: Fox story" in bar.model_label.toolTip() and "used by: Code" in bar.model_label.toolTip()
    assert bar.memory_label.text() == "Models 1.0 GiB of 2.0 GiB" and not bar.memory_label.isHidden()
    assert bar.kv_label.isHidden()  # the most recent model's KV figure alone would mislead
    window.open_chat(fox.chat_id)  # the mark follows the chat in view at once, before the next poll
    assert bar.model_label.text() == "SmolLM2 (this chat) · Qwen 0.5B"
    controller._on_status(dict(REMOTE))  # a remote server: one model, no memory line
    assert bar.model_label.text() == "Model: Qwen 0.5B" and bar.memory_label.isHidden()
    assert not bar.kv_label.isHidden()


def test_a_reply_that_has_not_begun_says_what_it_waits_for(qtbot, app):
    controller = app.controller
    view = TranscriptView()
    qtbot.addWidget(view)
    reply = TranscriptMessage("assistant", "", "streaming")
    view.set_messages([TranscriptMessage("user", "Write some code"), reply])
    assert "Reading the chat…" in view.toPlainText()
    pending = PendingReply(controller)
    pending.watch(reply, "qwen", view.render_now)
    queued = several(model("smollm2", running=2), queue=[{"model": "qwen", "position": 2, "waiting_s": 3.0}])
    controller._on_status(queued)
    assert "Waiting for memory: 1 ahead" in view.toPlainText()
    assert controller.poll_interval_ms == 1000  # short while a chat waits, even if the engine looks idle
    controller._on_status(several(model("smollm2"), model("qwen", state="loading")))
    assert "Loading Qwen 0.5B…" in view.toPlainText()
    reply.content = "def"  # its first token (the chat renders it): the words go, the poll may rest again
    controller._on_status(several(model("qwen"), model("smollm2")))
    view.render_now()
    assert reply.pending == "" and "Loading" not in view.toPlainText() and "def" in view.toPlainText()
    controller._on_status(several(model("qwen"), model("smollm2")))
    assert controller.poll_interval_ms == 1000 * IDLE_POLL_FACTOR


def test_the_installed_tab_marks_every_loaded_model_and_unloads_one(qtbot, tmp_path, tiny_model_factory):
    store = ModelStore(tmp_path / "models")
    for i, model_id in enumerate(("smollm2", "qwen", "phi")):
        store.import_path(tiny_model_factory(seed=i + 1), model_id=model_id)
    table = InstalledTable(store, make_settings(tmp_path / "ember"))
    qtbot.addWidget(table)
    table.show_status(several(model("smollm2"), model("qwen", state="loading")))
    status_col = table.table.columnCount() - 1
    marks = {table.table.item(r, 0).data(Qt.UserRole): table.table.item(r, status_col).text()
             for r in range(table.table.rowCount())}
    assert marks == {"smollm2": "● loaded", "qwen": "◌ loading…", "phi": ""}
    assert "512.0 MiB" in table.table.item(table.model_ids().index("smollm2"), status_col).toolTip()
    table.select("phi")
    assert table.load_button.isEnabled() and not table.unload_button.isEnabled()
    table.select("smollm2")
    assert table.unload_button.isEnabled()
    with qtbot.waitSignal(table.unload_requested) as asked:
        qtbot.mouseClick(table.unload_button, Qt.LeftButton)
    assert asked.args == ["smollm2"] and "Unloading smollm2" in table.message.text()
    table.on_unload_finished("smollm2", "")
    assert table.message.text() == "smollm2 is unloaded; its memory is free."
    table.show_status(dict(REMOTE, model="phi"))  # an engine of one model at a time: that one marked
    assert table.loaded_ids() == ["phi"]


def test_the_chat_panels_switches_follow_the_chat_in_views_own_model(app):
    """Think and speculative decoding are switches of a model: the panel shows the chat's own
    model's, not those of whichever model was used last."""
    window, controller, panel = app.window, app.controller, app.window.settings_panel
    think = window.new_chat()
    app.chat_store.set_chat_model(think.chat_id, "qwen")
    plain = window.new_chat()
    app.chat_store.set_chat_model(plain.chat_id, "smollm2")
    status = several(model("smollm2", thinking={"switch": False}, speculative=False),
                     model("qwen", thinking={"switch": True, "effort": False}, speculative=True))
    status |= {"thinking": {"switch": False}}  # the top level: the newest model's (smollm2)
    window.open_chat(think.chat_id)
    controller._on_status(status)
    assert not panel.think.isHidden()
    window.open_chat(plain.chat_id)
    controller._on_status(status)
    assert panel.think.isHidden()
