"""The replies Regenerate wrote for one assistant message, kept so that a reopened chat can still flip
between them (‹ reply 1 of 3 ›). A table of its own in the chat history's SQLite file (WAL, so a second
connection is fine): a row per message, the versions as a JSON list and the one shown. The message's own
`content` in ChatStore is always the version shown, so export and the next turn never read this table.
Deleting a message or its chat deletes its row (foreign key, enforced by ChatStore's connection).
"""
from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reply_versions (
    message_id INTEGER PRIMARY KEY REFERENCES messages(id) ON DELETE CASCADE,
    versions TEXT NOT NULL,   -- JSON list of strings, oldest first
    shown INTEGER NOT NULL
);
"""


class ReplyVersions:
    """`get(message_id) -> (versions, shown)`; `put(message_id, versions, shown)` for two or more versions."""

    def __init__(self, history_path: Path | str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(Path(history_path), timeout=10.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, message_id: int) -> tuple[list[str], int]:
        with self._lock:
            row = self._db.execute("SELECT versions, shown FROM reply_versions WHERE message_id=?",
                                   (message_id,)).fetchone()
        if row is None:
            return [], 0
        try:
            versions = [v for v in json.loads(row[0]) if isinstance(v, str)]
        except ValueError:
            return [], 0
        return versions, min(max(0, int(row[1])), max(0, len(versions) - 1))

    def put(self, message_id: int, versions: list[str], shown: int) -> None:
        if len(versions) < 2:
            return
        with self._lock:
            try:
                self._db.execute("INSERT INTO reply_versions(message_id, versions, shown) VALUES (?,?,?) "
                                 "ON CONFLICT(message_id) DO UPDATE SET versions=excluded.versions, "
                                 "shown=excluded.shown", (message_id, json.dumps(versions, ensure_ascii=False),
                                                          shown))
            except sqlite3.IntegrityError:  # the message was deleted meanwhile
                pass
