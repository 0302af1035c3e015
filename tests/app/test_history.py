"""ChatStore on a real SQLite file: WAL, cascade, search, export, threads, and a writer killed mid-reply."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from app.history import ChatStore, HistoryError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(tmp_path):
    with ChatStore(tmp_path / "chats.sqlite3") as s:
        yield s


def test_wal_and_foreign_keys_are_on(store, tmp_path):
    assert store.journal_mode == "wal"
    raw = sqlite3.connect(store.path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # persistent in the file
    raw.close()


def test_chat_life_cycle(store):
    a = store.create_chat("Recipes", model="smollm2", settings={"temperature": 0.7, "system_prompt": "Be brief"})
    b = store.create_chat("Rust questions")
    u = store.add_message(a, "user", "How do I bake bread?")
    r = store.add_message(a, "assistant", "", status="streaming")
    store.update_message(r, content="Mix flour")
    store.update_message(r, content="Mix flour and water.", status="done", tok_s=123.4, ttft=0.05)
    msgs = store.messages(a)
    assert [(m.id, m.role, m.content, m.status) for m in msgs] == [
        (u, "user", "How do I bake bread?", "done"), (r, "assistant", "Mix flour and water.", "done")]
    assert (msgs[1].tok_s, msgs[1].ttft) == (123.4, 0.05)
    assert [c.id for c in store.list_chats()] == [a, b]  # a was updated last
    store.rename_chat(b, "Rust, borrowck")
    assert store.get_chat(b).title == "Rust, borrowck" and store.list_chats()[0].id == b
    store.update_chat_settings(a, {"temperature": 0.2, "system_prompt": None, "top_p": 0.9})
    assert store.get_chat(a).settings == {"temperature": 0.2, "top_p": 0.9}
    store.set_chat_model(a, "qwen")
    assert store.get_chat(a).model == "qwen"
    store.delete_message(r)
    assert [m.id for m in store.messages(a)] == [u]


def test_a_new_message_moves_its_chat_up_a_streaming_reply_does_not(store):
    """The list must not reorder under the pointer while replies stream into several chats."""
    a, b = store.create_chat("a"), store.create_chat("b")
    store.add_message(a, "user", "hello")
    ra = store.add_message(a, "assistant", "", status="streaming")
    store.add_message(b, "user", "hi")
    rb = store.add_message(b, "assistant", "", status="streaming")
    assert [c.id for c in store.list_chats()] == [b, a]
    store.update_message(ra, content="Hello there")
    store.update_message(ra, content="Hello there!", status="done")
    assert [c.id for c in store.list_chats()] == [b, a]  # a's reply finishing leaves it where it was
    store.update_message(rb, content="Hi!", status="done")
    store.add_message(a, "user", "again")
    assert [c.id for c in store.list_chats()] == [a, b]  # a new message does move it


def test_delete_cascades_to_messages(store):
    a = store.create_chat("x")
    for i in range(5):
        store.add_message(a, "user", f"m{i}")
    store.delete_chat(a)
    with pytest.raises(HistoryError):
        store.get_chat(a)
    raw = sqlite3.connect(store.path)
    assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    raw.close()


def test_bad_arguments_raise_clear_errors_and_change_nothing(store):
    a = store.create_chat("x")
    with pytest.raises(HistoryError, match="role"):
        store.add_message(a, "wizard", "hi")
    with pytest.raises(HistoryError, match="status"):
        store.add_message(a, "user", "hi", status="finished")
    with pytest.raises(HistoryError, match="no chat"):
        store.add_message(a + 100, "user", "hi")
    with pytest.raises(HistoryError, match="no message"):
        store.update_message(999, content="x")
    with pytest.raises(HistoryError, match="no chat"):
        store.rename_chat(999, "y")
    assert store.messages(a) == []


def test_search_titles_and_content_with_wildcards_literal(store):
    a = store.create_chat("Bread recipes")
    b = store.create_chat("Holiday")
    c = store.create_chat("Maths")
    store.add_message(b, "user", "What is 100% of a SOURDOUGH loaf?")
    store.add_message(c, "assistant", "x_1 + x_2 = ünïcödé")
    assert {ch.id for ch in store.list_chats(search="bread")} == {a}
    assert {ch.id for ch in store.list_chats(search="sourdough")} == {b}  # case-insensitive, in content
    assert {ch.id for ch in store.list_chats(search="100%")} == {b}
    assert store.list_chats(search="0_%") == []  # % and _ are literal, not wildcards
    assert {ch.id for ch in store.list_chats(search="x_2")} == {c}
    assert {ch.id for ch in store.list_chats(search="ünïcödé")} == {c}
    assert len(store.list_chats(search="")) == 3 and len(store.list_chats(limit=2)) == 2


def test_export_markdown_and_json_round_trip(store):
    a = store.create_chat("Code", model="smollm2", settings={"system_prompt": "You write Python."})
    store.add_message(a, "user", "Print hello")
    store.add_message(a, "assistant", "```python\nprint('hello')\n```", tok_s=99.0, ttft=0.1)
    store.add_message(a, "assistant", "half a rep", status="stopped")
    md = store.export_markdown(a)
    assert md.startswith("# Code\n")
    assert "Model: smollm2" in md and "System prompt: You write Python." in md
    assert "## User\n\nPrint hello" in md and "```python\nprint('hello')\n```" in md
    assert "## Assistant _(stopped)_\n\nhalf a rep" in md
    doc = json.loads(store.export_json(a))
    assert doc["format"] == "ember-chat" and doc["title"] == "Code" and len(doc["messages"]) == 3
    assert doc["messages"][1]["tok_s"] == 99.0
    b = store.import_json(store.export_json(a))
    assert b != a
    assert [(m.role, m.content, m.status) for m in store.messages(b)] == \
        [(m.role, m.content, m.status) for m in store.messages(a)]
    with pytest.raises(HistoryError):
        store.import_json('{"format": "other"}')
    with pytest.raises(HistoryError):
        store.import_json("not json")


def test_threads_write_concurrently(store):
    chats = [store.create_chat(f"c{i}") for i in range(4)]
    errors: list[BaseException] = []

    def writer(chat_id: int) -> None:
        try:
            mid = store.add_message(chat_id, "assistant", "", status="streaming")
            for n in range(50):
                store.update_message(mid, content="tok " * n)
            store.update_message(mid, status="done")
            for n in range(20):
                store.add_message(chat_id, "user", f"msg {n}")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(c,)) for c in chats]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for c in chats:
        msgs = store.messages(c)
        assert len(msgs) == 21 and msgs[0].content == "tok " * 49 and msgs[0].status == "done"


CHILD = textwrap.dedent("""
    import sys
    from app.history import ChatStore
    s = ChatStore(sys.argv[1])
    chat = s.create_chat("crash test")
    for i in range(3):
        s.add_message(chat, "user", f"question {i}")
    reply = s.add_message(chat, "assistant", "", status="streaming")
    text = ""
    n = 0
    while True:                       # stream forever; the parent kills us mid-reply
        n += 1
        text += f"token{n} "
        s.update_message(reply, content=text)
        print(chat, reply, n, flush=True)
""")


def test_writer_killed_mid_reply_loses_nothing_committed(tmp_path):
    path = tmp_path / "chats.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        last = None
        for _ in range(200):  # wait for 200 committed updates
            last = proc.stdout.readline().split()
            assert last, "child died early"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    chat, reply, n = map(int, last)
    assert proc.returncode == -signal.SIGKILL
    assert Path(str(path) + "-wal").exists()  # the WAL was not checkpointed away by a clean close

    store = ChatStore(path)
    try:
        assert store.repaired == 1
        msgs = store.messages(chat)
        assert [m.content for m in msgs[:3]] == ["question 0", "question 1", "question 2"]
        assert msgs[3].id == reply and msgs[3].status == "error"  # repaired, partial text kept
        # every update the child reported as committed is there (it may have committed a few more)
        assert msgs[3].content.startswith("".join(f"token{i} " for i in range(1, n + 1)))
        assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        store.close()
    with ChatStore(path) as again:
        assert again.repaired == 0  # repaired once, for good
