"""Chats and their messages in one SQLite file (WAL), with Markdown and JSON export.

One connection behind a lock, so the GUI thread and workers may call it; every method is one
transaction. WAL with synchronous=NORMAL keeps every committed write across a crash of this
process (only an OS crash can lose the last transactions). A message still marked 'streaming'
when the store is opened belongs to a process that died mid-reply: it keeps its partial text and
becomes 'error'.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.agent.steps import ToolStep, steps_json
from app.doc_sources import Source, parse_sources, sources_json
from app.history_export import chat_markdown
from app.history_images import ImageFolder, ImageRef, images_from_json, images_json
from app.history_rows import Chat, Message, chat_row, message_row
from app.history_schema import ROLES, SCHEMA_VERSION, STATUSES, calls_json, open_history

EXPORT_FORMAT = "ember-chat"


class HistoryError(ValueError):
    """A bad argument (unknown chat, role or status); the store itself is unchanged."""


class ChatStore:
    def __init__(self, path: Path | str, repair: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = open_history(self.path)  # autocommit: transactions are explicit (BEGIN IMMEDIATE in _tx)
        self.images = ImageFolder(self.path.parent / "images")  # the messages' pictures, by the hash of their bytes
        self.repaired = self.repair_interrupted() if repair else 0

    # ---- plumbing ----
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ChatStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        with self._lock:
            return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    def repair_interrupted(self) -> int:
        """Replies left 'streaming' by a dead process keep their text and become 'error'."""
        with self._tx() as db:
            return db.execute("UPDATE messages SET status='error' WHERE status='streaming'").rowcount

    # ---- chats ----
    def create_chat(self, title: str, model: str | None = None, settings: dict[str, Any] | None = None) -> int:
        now = time.time()
        with self._tx() as db:
            cur = db.execute("INSERT INTO chats(title, model, settings, created_at, updated_at) VALUES (?,?,?,?,?)",
                             (str(title), model, _dump_settings(settings), now, now))
            return int(cur.lastrowid)

    def get_chat(self, chat_id: int) -> Chat:
        with self._lock:
            row = self._db.execute("SELECT * FROM chats WHERE id=?", (chat_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no chat with id {chat_id}")
        return chat_row(row)

    def list_chats(self, search: str | None = None, limit: int | None = None) -> list[Chat]:
        """Most recently updated first; `search` matches titles and message text (case-insensitive)."""
        sql, args = "SELECT * FROM chats", []
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += (" WHERE title LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM messages m"
                    " WHERE m.chat_id = chats.id AND m.content LIKE ? ESCAPE '\\')")
            args += [pattern, pattern]
        sql += " ORDER BY updated_at DESC, id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._lock:
            return [chat_row(r) for r in self._db.execute(sql, args)]

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._update_chat(chat_id, "title=?", str(title))

    def set_chat_model(self, chat_id: int, model: str | None) -> None:
        self._update_chat(chat_id, "model=?", model)

    def update_chat_settings(self, chat_id: int, settings: dict[str, Any]) -> None:
        """Merge `settings` into the chat's settings (a key set to None is removed)."""
        with self._tx() as db:
            row = db.execute("SELECT settings FROM chats WHERE id=?", (chat_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no chat with id {chat_id}")
            merged = {**json.loads(row[0]), **settings}
            merged = {k: v for k, v in merged.items() if v is not None}
            db.execute("UPDATE chats SET settings=?, updated_at=? WHERE id=?",
                       (_dump_settings(merged), time.time(), chat_id))

    def delete_chat(self, chat_id: int) -> None:
        with self._tx() as db:  # messages go with it (ON DELETE CASCADE), and the pictures no other chat holds
            if db.execute("DELETE FROM chats WHERE id=?", (chat_id,)).rowcount == 0:
                raise HistoryError(f"no chat with id {chat_id}")
        self.drop_images()

    def drop_images(self, refs: list[ImageRef] | None = None) -> int:
        """Delete the picture files of `refs` (None: any) that no message holds now; returns how many."""
        if refs is not None and not refs:
            return 0  # a reply (Regenerate): no pictures, no look at the folder
        with self._lock:
            held = self._db.execute("SELECT images FROM messages WHERE images IS NOT NULL").fetchall()
        return self.images.sweep({ref.sha256 for (text,) in held for ref in images_from_json(text)},
                                 only=None if refs is None else {ref.sha256 for ref in refs})

    def _update_chat(self, chat_id: int, assignment: str, value: Any) -> None:
        with self._tx() as db:
            cur = db.execute(f"UPDATE chats SET {assignment}, updated_at=? WHERE id=?", (value, time.time(), chat_id))
            if cur.rowcount == 0:
                raise HistoryError(f"no chat with id {chat_id}")

    # ---- messages ----
    def add_message(self, chat_id: int, role: str, content: str, status: str = "done",
                    tok_s: float | None = None, ttft: float | None = None, images: list[ImageRef] | None = None) -> int:
        _check(role=role, status=status)
        now = time.time()
        with self._tx() as db:
            try:
                cur = db.execute("INSERT INTO messages(chat_id, role, content, status, created_at, tok_s, ttft, images)"
                                 " VALUES (?,?,?,?,?,?,?,?)",
                                 (chat_id, role, str(content), status, now, tok_s, ttft, images_json(images)))
            except sqlite3.IntegrityError:
                raise HistoryError(f"no chat with id {chat_id}") from None
            db.execute("UPDATE chats SET updated_at=? WHERE id=?", (now, chat_id))
            return int(cur.lastrowid)

    def update_message(self, message_id: int, content: str | None = None, status: str | None = None,
                       tok_s: float | None = None, ttft: float | None = None, reasoning: str | None = None,
                       thought_s: float | None = None, model: str | None = None,
                       finish_reason: str | None = None, tool_calls: list[tuple[str, str]] | None = None,
                       tool_steps: list[ToolStep] | None = None, notices: list[str] | None = None,
                       sources: list[Source] | None = None) -> None:
        """Change what is given; the GUI calls it as a reply streams (content) and once at the end (status).

        The chat keeps its place in the list: a reply that streams or finishes does not move it
        (only a new message does), or the list would reorder under the user's pointer while
        several chats stream."""
        if status is not None:
            _check(status=status)
        sets, args = [], []
        for column, value in (("content", content), ("status", status), ("tok_s", tok_s), ("ttft", ttft),
                              ("reasoning", reasoning), ("thought_s", thought_s), ("model", model),
                              ("finish_reason", finish_reason), ("tool_calls", calls_json(tool_calls)),
                              ("tool_steps", None if tool_steps is None else steps_json(tool_steps)),
                              ("notices", None if notices is None else json.dumps(notices, ensure_ascii=False)),
                              ("sources", sources_json(sources))):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(str(value) if column in ("content", "reasoning") else value)
        with self._tx() as db:
            row = db.execute("SELECT chat_id FROM messages WHERE id=?", (message_id,)).fetchone()
            if row is None:
                raise HistoryError(f"no message with id {message_id}")
            if sets:
                db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", (*args, message_id))

    def delete_message(self, message_id: int, keep_images: bool = False) -> None:
        """Regenerate drops the last reply before asking again; a question deleted takes its pictures
        that no other message holds (`keep_images`: Edit reads them back first, then `drop_images`)."""
        with self._tx() as db:
            row = db.execute("SELECT images FROM messages WHERE id=?", (message_id,)).fetchone()
            if row is None or db.execute("DELETE FROM messages WHERE id=?", (message_id,)).rowcount == 0:
                raise HistoryError(f"no message with id {message_id}")
        if not keep_images:
            self.drop_images(images_from_json(row[0]))

    def get_message(self, message_id: int) -> Message:
        with self._lock:
            row = self._db.execute("SELECT * FROM messages WHERE id=?", (message_id,)).fetchone()
        if row is None:
            raise HistoryError(f"no message with id {message_id}")
        return message_row(row)

    def messages(self, chat_id: int) -> list[Message]:
        with self._lock:
            return [message_row(r) for r in self._db.execute(
                "SELECT * FROM messages WHERE chat_id=? ORDER BY id", (chat_id,))]

    # ---- export / import ----
    def export_markdown(self, chat_id: int, path: Path | None = None) -> str:
        """The chat as Markdown (app/history_export.py), its tool calls with their arguments and results.
        With `path` (where the text will be written) its images are copied into `<stem>_images/` beside
        it and linked by relative paths; without, linked where this store keeps them."""
        messages = self.messages(chat_id)
        refs = [r for m in messages for r in m.images]
        folder = self.images.copy_beside(refs, path) if path is not None and refs else self.images.folder.as_uri()
        return chat_markdown(self.get_chat(chat_id), messages, folder)

    def export_json(self, chat_id: int) -> str:
        chat = self.get_chat(chat_id)
        doc = {"format": EXPORT_FORMAT, "version": SCHEMA_VERSION, **asdict(chat),
               "messages": [{k: v for k, v in asdict(m).items() if k != "chat_id"} for m in self.messages(chat_id)]}
        return json.dumps(doc, ensure_ascii=False, indent=2)

    def import_json(self, text: str) -> int:
        """Add a chat exported by export_json (as a new chat); its messages keep their text and status."""
        try:
            doc = json.loads(text)
            if doc.get("format") != EXPORT_FORMAT:
                raise ValueError(f"not an {EXPORT_FORMAT} export")
            title, messages = str(doc["title"]), list(doc["messages"])
            for m in messages:
                _check(role=m["role"], status=m.get("status", "done"))
            steps = [steps_json([ToolStep.from_json(d) for d in m.get("tool_steps") or ()]) for m in messages]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise HistoryError(f"cannot import chat: {e}") from None
        with self._tx() as db:
            now = time.time()
            cur = db.execute("INSERT INTO chats(title, model, settings, created_at, updated_at) VALUES (?,?,?,?,?)",
                             (title, doc.get("model"), _dump_settings(doc.get("settings")),
                              float(doc.get("created_at", now)), now))
            chat_id = int(cur.lastrowid)
            db.executemany("INSERT INTO messages(chat_id, role, content, status, created_at, tok_s, ttft, reasoning,"
                           " thought_s, tool_steps, sources, images) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                           [(chat_id, m["role"], str(m["content"]), m.get("status", "done"),
                             float(m.get("created_at", now)), m.get("tok_s"), m.get("ttft"),
                             str(m.get("reasoning") or ""), m.get("thought_s"), s,
                             sources_json(parse_sources(m.get("sources"))), images_json(images_from_json(m.get("images"))))
                            for m, s in zip(messages, steps)])
            return chat_id


def _check(role: str | None = None, status: str | None = None) -> None:
    if role is not None and role not in ROLES:
        raise HistoryError(f"role must be one of {ROLES}, not {role!r}")
    if status is not None and status not in STATUSES:
        raise HistoryError(f"status must be one of {STATUSES}, not {status!r}")


def _dump_settings(settings: dict[str, Any] | None) -> str:
    if settings is not None and not isinstance(settings, dict):
        raise HistoryError("chat settings must be a dict")
    return json.dumps(settings or {}, ensure_ascii=False, sort_keys=True)
