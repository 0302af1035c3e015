"""The chat store keeps each documents reply's sources (schema 5): an old schema-4 file (built here
with that schema's own SQL) migrates with its messages, tool steps and notices intact and takes
sources; the Markdown export lists them under the reply, the JSON export and import carry them."""
from __future__ import annotations

import json
import sqlite3

from app.doc_sources import Source, parse_sources
from app.history import ChatStore
from app.history_schema import SCHEMA_VERSION

# The schema of Ember's history files before sources (user_version 4), as that version wrote it.
SCHEMA_4 = """
CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL, model TEXT, settings TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')), content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done' CHECK (status IN ('done', 'streaming', 'error', 'stopped')),
    created_at REAL NOT NULL, tok_s REAL, ttft REAL, reasoning TEXT NOT NULL DEFAULT '', thought_s REAL,
    model TEXT, finish_reason TEXT, tool_calls TEXT, tool_steps TEXT, notices TEXT);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE INDEX chats_by_update ON chats(updated_at);
PRAGMA user_version=4;
"""

QUENBY = Source(1, "file-abc", "lighthouse_report.pdf", "page 2", "In 1911 its keeper was Marisol Quenby.", 0.83,
                "vs_1", "/home/u/lighthouse_report.pdf")
RECIPE = Source(2, "file-def", "recipes.md", "Grandma Irelle's plum cake", "340 grams of rye flour", 0.41, "vs_1")


def test_an_old_schema_4_file_migrates_and_keeps_sources(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_4)
    db.execute("INSERT INTO chats VALUES (1, 'old chat', 'qwen', '{}', 1.0, 2.0)")
    db.execute("INSERT INTO messages(chat_id, role, content, created_at, notices) VALUES"
               " (1, 'user', 'who kept the light?', 1.0, NULL), (1, 'assistant', 'Quenby [1].', 1.5, '[\"a notice\"]')")
    db.commit()
    db.close()

    store = ChatStore(path)
    user, reply = store.messages(1)
    assert (user.content, reply.content, reply.notices, reply.sources) == (
        "who kept the light?", "Quenby [1].", ["a notice"], [])
    store.update_message(reply.id, sources=[QUENBY, RECIPE])
    store.close()

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 5
    store = ChatStore(path)
    assert store.get_message(reply.id).sources == [QUENBY, RECIPE]
    assert store.get_message(reply.id).notices == ["a notice"]
    store.close()


def test_the_exports_list_the_sources(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("docs")
    store.add_message(chat, "user", "Who kept the Harrowgate lighthouse?")
    reply = store.add_message(chat, "assistant", "Marisol Quenby [1].")
    store.update_message(reply, sources=[QUENBY, RECIPE])

    md = store.export_markdown(chat)
    assert "**Sources**" in md
    assert "1. `lighthouse_report.pdf` — page 2 (/home/u/lighthouse_report.pdf)" in md
    assert "   > In 1911 its keeper was Marisol Quenby." in md
    assert "2. `recipes.md` — Grandma Irelle's plum cake" in md

    exported = store.export_json(chat)
    assert json.loads(exported)["messages"][1]["sources"][0]["filename"] == "lighthouse_report.pdf"
    copy = store.import_json(exported)
    assert store.messages(copy)[1].sources == [QUENBY, RECIPE]
    store.close()


def test_malformed_sources_read_as_none_and_the_wire_shape_parses():
    wire = [{"index": 1, "file_id": "file-1", "filename": "a.pdf", "location": "page 3", "text": "t",
             "score": 0.5, "vector_store_id": "vs_1"}, "junk", {"index": "x"}]
    (s,) = parse_sources(wire)
    assert (s.index, s.label, s.page, s.path) == (1, "a.pdf, page 3", 3, "")
    assert parse_sources(None) == () and parse_sources({"not": "a list"}) == ()
