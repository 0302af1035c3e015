"""The chat store keeps a message's images (schema 6): files in the history's folder named by their
sha256, referenced from the message. An old schema-5 file (built here with that schema's own SQL)
opens, migrates and takes images; a message sends them as OpenAI `image_url` data: parts; the
Markdown export copies them beside the file and links them relatively; the JSON export carries them."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import sqlite3

import pytest
from PIL import Image as PILImage

from app.history import ChatStore
from app.history_images import ImageError, ImageFolder, image_parts, images_from_json, sniff_mime
from app.history_schema import SCHEMA_VERSION

# The schema of Ember's history files before images (user_version 5), as that version wrote it.
SCHEMA_5 = """
CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL, model TEXT, settings TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')), content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'done' CHECK (status IN ('done', 'streaming', 'error', 'stopped')),
    created_at REAL NOT NULL, tok_s REAL, ttft REAL, reasoning TEXT NOT NULL DEFAULT '', thought_s REAL,
    model TEXT, finish_reason TEXT, tool_calls TEXT, tool_steps TEXT, notices TEXT, sources TEXT);
CREATE INDEX messages_by_chat ON messages(chat_id, id);
CREATE INDEX chats_by_update ON chats(updated_at);
PRAGMA user_version=5;
"""


def png(colour: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (20, 12), colour).save(buf, format=fmt)
    return buf.getvalue()


def test_an_old_schema_5_file_migrates_and_keeps_images(tmp_path):
    path = tmp_path / "chats.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(SCHEMA_5)
    db.execute("INSERT INTO chats VALUES (1, 'old chat', 'gemma', '{}', 1.0, 2.0)")
    db.execute("INSERT INTO messages(chat_id, role, content, created_at, sources) VALUES"
               " (1, 'user', 'hello', 1.0, NULL), (1, 'assistant', 'hi', 1.5, '[]')")
    db.commit()
    db.close()

    store = ChatStore(path)
    assert [(m.content, m.images) for m in store.messages(1)] == [("hello", []), ("hi", [])]
    red = store.images.add(png((255, 0, 0)), "red.png")
    msg = store.add_message(1, "user", "what colour?", images=[red])
    store.close()

    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    store = ChatStore(path)  # reopened, as after a restart
    assert store.get_message(msg).images == [red]
    assert store.images.path(red) == tmp_path / "images" / (hashlib.sha256(png((255, 0, 0))).hexdigest() + ".png")
    assert store.images.read(red) == png((255, 0, 0))
    store.close()


def test_images_are_kept_once_per_content_and_refused_when_they_are_none(tmp_path):
    folder = ImageFolder(tmp_path / "images")
    a, b = folder.add(png((1, 2, 3)), "a.png"), folder.add(png((1, 2, 3)), "b.png")
    assert a.sha256 == b.sha256 and len(list((tmp_path / "images").iterdir())) == 1
    jpeg = folder.add(png((9, 9, 9), "JPEG"))
    assert jpeg.mime == "image/jpeg" and folder.path(jpeg).suffix == ".jpg"
    assert sniff_mime(png((0, 0, 0), "WEBP")) == "image/webp"
    with pytest.raises(ImageError, match="notes.txt: not a PNG, JPEG or WebP"):
        folder.add(b"just words", "notes.txt")
    uri = folder.data_uri(a)
    assert uri.startswith("data:image/png;base64,") and base64.b64decode(uri.split(",", 1)[1]) == png((1, 2, 3))
    assert image_parts("look", [uri]) == [{"type": "text", "text": "look"},
                                          {"type": "image_url", "image_url": {"url": uri}}]
    # a reference that could name a file outside the folder is not one
    assert images_from_json('[{"sha256": "../../etc/passwd", "mime": "image/png"}]') == []
    assert images_from_json("not json") == []


def test_the_markdown_export_links_copies_beside_it_and_json_carries_them(tmp_path):
    store = ChatStore(tmp_path / "history" / "chats.sqlite3")
    chat = store.create_chat("pictures")
    red, blue = store.images.add(png((255, 0, 0)), "red [1].png"), store.images.add(png((0, 0, 255)))
    store.add_message(chat, "user", "compare these", images=[red, blue])
    store.add_message(chat, "assistant", "one is red")

    out = tmp_path / "export" / "my chat.md"
    out.parent.mkdir()
    md = store.export_markdown(chat, out)
    assert f"![red 1.png](<my chat_images/{red.file_name}>)" in md
    assert f"![image](<my chat_images/{blue.file_name}>)" in md
    assert (out.parent / "my chat_images" / red.file_name).read_bytes() == png((255, 0, 0))
    assert md.index("compare these") < md.index(red.file_name) < md.index("one is red")
    assert store.images.folder.as_uri() in store.export_markdown(chat)  # no target: the store's own files

    doc = json.loads(store.export_json(chat))
    assert doc["messages"][0]["images"][0]["sha256"] == red.sha256
    again = store.import_json(store.export_json(chat))
    assert store.messages(again)[0].images == [red, blue]

    store.add_message(again, "user", "only blue", images=[blue])
    store.delete_chat(chat)  # the copy still holds both: nothing goes
    assert store.images.path(red).is_file() and store.images.path(blue).is_file()
    store.delete_message(store.messages(again)[0].id)
    store.delete_chat(again)  # the last chat that held them: their files go with it
    assert not store.images.path(red).exists() and not store.images.path(blue).exists()
    store.close()


def test_a_deleted_message_takes_the_pictures_no_other_message_holds(tmp_path):
    store = ChatStore(tmp_path / "history" / "chats.sqlite3")
    chat = store.create_chat("pictures")
    red, blue = store.images.add(png((255, 0, 0))), store.images.add(png((0, 0, 255)))
    first = store.add_message(chat, "user", "both", images=[red, blue])
    store.add_message(chat, "user", "blue again", images=[blue])
    loose = store.images.add(png((0, 255, 0)))  # no message holds it yet (a message about to be stored)
    store.delete_message(first)
    assert not store.images.path(red).exists()
    assert store.images.path(blue).is_file() and store.images.path(loose).is_file()  # held; not this message's

    edited = store.add_message(chat, "user", "red again", images=[store.images.add(png((255, 0, 0)))])
    store.delete_message(edited, keep_images=True)  # Edit: read back into the message box first
    assert store.images.read(red) == png((255, 0, 0))
    assert store.drop_images([red, blue]) == 1 and not store.images.path(red).exists()  # blue is still held
    store.close()
