"""The chat history's SQLite schema, and how its file is opened: WAL with synchronous=NORMAL,
foreign keys on, and a file from an older Ember migrated (its messages gain the newer columns)."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

ROLES = ("system", "user", "assistant", "tool")
STATUSES = ("done", "streaming", "error", "stopped")
SCHEMA_VERSION = 6  # 2: a reply's reasoning and how long the model thought; 3: its model, finish reason and
# tool calls; 4: the calls an agent ran for it, with their results (tool_steps), and its notices;
# 5: the passages of the user's documents it was given (sources); 6: a message's images (app/history_images.py)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT,
    settings TEXT NOT NULL DEFAULT '{{}}',   -- JSON object: system prompt, temperature, ...
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN {ROLES}),
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done' CHECK (status IN {STATUSES}),
    created_at REAL NOT NULL,
    tok_s REAL,   -- decode speed of an assistant reply, measured by the client
    ttft REAL,    -- seconds to the first token
    reasoning TEXT NOT NULL DEFAULT '',  -- a reasoning model's thinking, apart from its answer
    thought_s REAL,                      -- seconds it thought
    model TEXT,                          -- the model that wrote a reply (its id)
    finish_reason TEXT,                  -- the server's: stop, length, tool_calls, ...
    tool_calls TEXT,                     -- JSON list of {"name", "arguments"}: the calls a reply made
    tool_steps TEXT,                     -- JSON list of ToolStep (app/agent/steps.py): the calls run, and results
    notices TEXT,                        -- JSON list of lines the chat said about the reply (a server that failed)
    sources TEXT,                        -- JSON list of Source (app/doc_sources.py): the passages it was given
    images TEXT                          -- JSON list of ImageRef (app/history_images.py): the pictures it holds
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
CREATE INDEX IF NOT EXISTS chats_by_update ON chats(updated_at);
"""


# Columns added since schema 1, for files written before them: (name, declaration).
_ADDED_COLUMNS = (("reasoning", "TEXT NOT NULL DEFAULT ''"), ("thought_s", "REAL"), ("model", "TEXT"),
                  ("finish_reason", "TEXT"), ("tool_calls", "TEXT"), ("tool_steps", "TEXT"), ("notices", "TEXT"),
                  ("sources", "TEXT"), ("images", "TEXT"))


def open_history(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode to the history at `path`, its schema current; refuses a newer one."""
    db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise sqlite3.OperationalError(f"cannot enable WAL on {path} (journal_mode={mode})")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"{path} was written by a newer Ember (schema {version})")
    db.executescript(_SCHEMA)  # idempotent (IF NOT EXISTS)
    have = {r["name"] for r in db.execute("PRAGMA table_info(messages)")}
    for name, declaration in _ADDED_COLUMNS:  # an older file: its messages gain the new fields
        if name not in have:
            db.execute(f"ALTER TABLE messages ADD COLUMN {name} {declaration}")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    return db


# The JSON columns, written and read back (a malformed value reads as empty).
def calls_json(calls: list[tuple[str, str]] | None) -> str | None:
    return None if calls is None else json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)


def calls_from_json(text: str | None) -> list[tuple[str, str]]:
    try:
        return [(c["name"], c["arguments"]) for c in json.loads(text or "[]")]
    except (ValueError, TypeError, KeyError):
        return []


def notices_from_json(text: str | None) -> list[str]:
    try:
        return [str(n) for n in json.loads(text or "[]")]
    except (ValueError, TypeError):
        return []

