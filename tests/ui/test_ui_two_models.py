"""Two chats on two models against a real engine process that holds several models (issue 63): both
stream at once and finish with their text, the status bar names both; with room for one model only, the
second chat's reply says it waits for memory until the first one's reply ends, then runs."""
from __future__ import annotations

import pytest

from app.store import ModelStore
from server_util import LONG_CTX, long_max_tokens
from ui_support import LONG_KV, app_on, make_settings, replies_ignore_eos, start_engine

pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def two_models(tmp_path, tiny_model_factory):
    """Settings whose store holds two tiny models, "alpha" and "beta" (different weights, one size)."""
    settings = make_settings(tmp_path / "ember")
    store = ModelStore(settings.models_dir)
    for seed, model_id in ((1, "alpha"), (2, "beta")):
        store.import_path(tiny_model_factory(ctx=LONG_CTX, seed=seed), model_id=model_id, mode="link")
    return settings, store


def chat_on(app, model_id: str, title: str, **settings):
    view = app.window.new_chat()
    app.chat_store.rename_chat(view.chat_id, title)
    app.chat_store.set_chat_model(view.chat_id, model_id)
    app.chat_store.update_chat_settings(view.chat_id, {"temperature": 0.0, **settings})
    return view


def test_two_chats_on_two_models_stream_at_once(qtbot, two_models, monkeypatch):
    settings, store = two_models
    replies_ignore_eos(monkeypatch)  # replies of seconds each: they overlap on any CPU
    sup = start_engine(settings, store.get("alpha").path, extra_args=LONG_KV)
    try:
        with app_on(qtbot, make_settings(settings.data_dir.parent / "app"), sup) as app:
            n = long_max_tokens(sup.base_url, sup.api_key, seconds=3)
            a = chat_on(app, "alpha", "Fox story", max_tokens=n)
            b = chat_on(app, "beta", "Counting", max_tokens=n)
            both = []

            def check(_stats):
                if a.is_streaming and b.is_streaming and a.transcript.messages[-1].content \
                        and b.transcript.messages[-1].content:
                    both.append(True)

            a.reply_stats.connect(check)
            b.reply_stats.connect(check)
            with qtbot.waitSignals([a.reply_finished, b.reply_finished], timeout=240_000):
                a.send("Tell me a story about a fox.")
                b.send("Count from one to fifty.")  # beta loads just in time beside alpha: nothing is cut
            assert [v.transcript.messages[-1].status for v in (a, b)] == ["done", "done"], \
                [v.transcript.messages[-1].error for v in (a, b)]
            assert both, "the two replies never streamed at the same time"
            for view, model_id in ((a, "alpha"), (b, "beta")):
                reply = app.chat_store.messages(view.chat_id)[-1]
                assert reply.status == "done" and reply.content and reply.model == model_id
            status = app.controller.last_status
            assert {m["id"] for m in status["models"]} >= {"alpha", "beta"}
            app.window.open_chat(b.chat_id)
            bar = app.window.status.model_label
            qtbot.waitUntil(lambda: "(this chat)" in bar.text() and " · " in bar.text(), timeout=10_000)
            assert "used by: Counting" in bar.toolTip() and "used by: Fox story" in bar.toolTip()
    finally:
        sup.stop()


def test_with_room_for_one_model_the_second_chat_waits_for_memory(qtbot, two_models, monkeypatch):
    settings, store = two_models
    replies_ignore_eos(monkeypatch)
    sup = start_engine(settings, store.get("alpha").path, extra_args=(*LONG_KV, "--max-loaded-models", "1"))
    try:
        with app_on(qtbot, make_settings(settings.data_dir.parent / "app"), sup) as app:
            n = long_max_tokens(sup.base_url, sup.api_key)  # about 20 s: running while beta waits
            a = chat_on(app, "alpha", "Fox story", max_tokens=n)
            b = chat_on(app, "beta", "Counting", max_tokens=16)
            a.send("Tell me a story about a fox.")
            qtbot.waitUntil(lambda: bool(a.transcript.messages[-1].content), timeout=120_000)
            with qtbot.waitSignal(b.reply_finished, timeout=240_000) as done:
                b.send("Count from one to fifty.")
                qtbot.waitUntil(lambda: "Waiting for memory: next in line" in b.transcript.toPlainText(),
                                timeout=60_000)
                assert a.is_streaming and "waiting for memory" in app.window.status.state_label.text()
                a.stop()  # alpha's reply ends: alpha is idle, so it makes room for beta
            assert done.args == [b.chat_id, "done"], b.transcript.messages[-1].error
            assert b.transcript.messages[-1].content and "Waiting" not in b.transcript.toPlainText()
            qtbot.waitUntil(lambda: [m["id"] for m in app.controller.last_status.get("models", [])] == ["beta"],
                            timeout=30_000)
    finally:
        sup.stop()
