"""The chat store keeps the tool calls an agent ran (schema 4): each reply that made calls holds them,
results included, in its own field; an old schema-3 file (built here with that schema's own SQL)
migrates with its messages intact; the Markdown and JSON exports carry the calls."""
from __future__ import annotations

import json
import sqlite3

from app.agent.steps import CallStatus, ToolStep
from app.history import ChatStore
from app.history_export import fenced
from app.history_schema import SCHEMA_VERSION

# The schema of Ember's history files before tool steps (user_version 3), as that version wrote it.
SCHEMA_3 = """
CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL, model TEXT, settings TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')), content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done' CHECK (status IN ('done', 'streaming', 'error', 'stopped')),
    created_at REAL NOT NULL, tok_s REAL, ttft REAL, reasoning TEXT NOT NULL DEFAULT '', thought_s REAL,
    model TEXT, finish_reason TEXT, tool_calls TEXT);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE INDEX chats_by_update ON chats(updated_at);
PRAGMA user_version=3;
"""


def lookup_step(**kw) -> ToolStep:
    return ToolStep("call_1", "lookup", '{"key": "door"}', "notes", "lookup", CallStatus.OK,
                    "ember-secret-door-7731", 0.25, **kw)


def test_an_old_schema_3_file_migrates_and_keeps_tool_steps(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_3)
    db.execute("INSERT INTO chats VALUES (1, 'old chat', 'qwen', '{}', 1.0, 2.0)")
    db.execute("INSERT INTO messages(chat_id, role, content, created_at, finish_reason, tool_calls) VALUES"
               " (1, 'user', 'hello', 1.0, NULL, NULL), (1, 'assistant', 'hi there', 1.5, 'tool_calls',"
               " '[{\"name\": \"lookup\", \"arguments\": \"{}\"}]')")
    db.commit()
    db.close()

    store = ChatStore(path)
    user, reply = store.messages(1)
    assert (user.content, reply.content, reply.tool_calls) == ("hello", "hi there", [("lookup", "{}")])
    assert reply.tool_steps == [] and reply.notices == []
    store.update_message(reply.id, tool_steps=[lookup_step(truncated=True)], notices=["server 'x' failed"])
    store.close()

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # the current one
    store = ChatStore(path)
    (step,) = store.get_message(reply.id).tool_steps
    assert step == lookup_step(truncated=True) and store.get_message(reply.id).notices == ["server 'x' failed"]
    store.close()


def test_the_exports_carry_each_call_with_its_arguments_and_result(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("tools")
    store.add_message(chat, "user", "What is under door?")
    reply = store.add_message(chat, "assistant", "")
    hostile = ToolStep("call_2", "big", '{"n": 3}', "notes", "big", CallStatus.ERROR, "```\n<b>not bold</b>\n```", 1.0)
    store.update_message(reply, tool_steps=[lookup_step(), hostile])
    store.add_message(chat, "assistant", "It is ember-secret-door-7731.")

    md = store.export_markdown(chat)
    assert "`notes · lookup · ok · 0.2 s`" in md and '"key": "door"' in md and "ember-secret-door-7731" in md
    assert fenced(hostile.result) in md and fenced(hostile.result).startswith("````\n")  # no line closes it early
    copy = store.import_json(store.export_json(chat))
    assert [m.tool_steps for m in store.messages(copy)] == [[], [lookup_step(), hostile], []]
    assert json.loads(store.export_json(copy))["messages"][1]["tool_steps"][0]["status"] == "ok"
    store.close()
