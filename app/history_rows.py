"""A chat and a message as the app reads them from the chat store (app/history.py): the rows, their
JSON columns parsed."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from app.agent.steps import ToolStep, steps_from_json
from app.doc_sources import Source, sources_from_json
from app.history_images import ImageRef, images_from_json
from app.history_schema import calls_from_json, notices_from_json


@dataclass(frozen=True, slots=True)
class Chat:
    id: int
    title: str
    model: str | None
    settings: dict[str, Any]
    created_at: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class Message:
    id: int
    chat_id: int
    role: str
    content: str
    status: str
    created_at: float
    tok_s: float | None = None
    ttft: float | None = None
    reasoning: str = ""
    thought_s: float | None = None
    model: str | None = None  # the model that wrote a reply
    finish_reason: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments JSON) of its calls
    tool_steps: list[ToolStep] = field(default_factory=list)  # the calls an agent ran for it, with results
    notices: list[str] = field(default_factory=list)  # what the chat said about it (a server that failed)
    sources: list[Source] = field(default_factory=list)  # the passages of the user's documents it was given
    images: list[ImageRef] = field(default_factory=list)  # the pictures of a user's message (app/history_images.py)


def chat_row(row: sqlite3.Row) -> Chat:
    return Chat(row["id"], row["title"], row["model"], json.loads(row["settings"]), row["created_at"],
                row["updated_at"])


def message_row(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["chat_id"], row["role"], row["content"], row["status"], row["created_at"],
                   row["tok_s"], row["ttft"], row["reasoning"], row["thought_s"], row["model"], row["finish_reason"],
                   calls_from_json(row["tool_calls"]), steps_from_json(row["tool_steps"]), notices_from_json(row["notices"]),
                   sources_from_json(row["sources"]), images_from_json(row["images"]))
