"""Opening a chat warms it (ui/chat_warm.py): the app asks the real engine, from a worker, to compute
the chat's prompt into its prefix cache; the next reply's prompt then comes from the cache, and
the status bar says how much ("cached N of M prompt tokens")."""
from __future__ import annotations

import pytest

from ui_support import ember, shared_engine  # noqa: F401

pytestmark = pytest.mark.timeout(300)
BLOCK = 16  # the engine's block size: the warm's last partial block is computed again by the turn


def test_opening_a_chat_warms_it_and_its_reply_says_cached(qtbot, ember):
    store, window = ember.chat_store, ember.window
    chat_id = store.create_chat("Lighthouses", settings={"temperature": 0.0, "max_tokens": 4})
    store.add_message(chat_id, "user", "Tell me about lighthouses. " * 20)
    store.add_message(chat_id, "assistant", "They guide ships at night. " * 10)
    window.chat_list.refresh()
    qtbot.waitUntil(lambda: ember.controller.state == "ready", timeout=60_000)
    with qtbot.waitSignal(window.warmer.warmed, timeout=120_000) as warmed:
        view = window.open_chat(chat_id)
    assert warmed.args[0] == chat_id and warmed.args[1]["prompt_tokens"] > 100
    assert window.warmer.warm_current() is None  # once per chat and engine start

    empty = window.new_chat()  # nothing said yet: nothing to warm, and what it says later this engine computes
    store.add_message(empty.chat_id, "user", "Hello")
    window.open_chat(chat_id)
    sending = set(window.warmer._workers)
    window.open_chat(empty.chat_id)
    assert window.warmer._workers <= sending and window.warmer.warm_current() is None
    window.open_chat(chat_id)

    with qtbot.waitSignal(view.reply_finished, timeout=120_000) as done:
        view.send("And in fog?")
    assert done.args == [chat_id, "done"], view.transcript.messages[-1].error
    full = warmed.args[1]["prompt_tokens"] // BLOCK * BLOCK
    assert window.status.cached_label.text().startswith(f"cached {full:,} of ")
    assert window.status.cached_label.text().endswith(" prompt tokens")
