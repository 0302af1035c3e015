"""The replies Regenerate wrote, kept next to the chat history: read back, updated, gone with their chat."""
from __future__ import annotations

from app.history import ChatStore
from app.reply_versions import ReplyVersions


def test_versions_round_trip_and_follow_their_message(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    versions = ReplyVersions(path)
    chat = store.create_chat("c")
    store.add_message(chat, "user", "q")
    reply = store.add_message(chat, "assistant", "second")
    versions.put(reply, ["first"], 0)  # one version is no choice: nothing kept
    assert versions.get(reply) == ([], 0)
    versions.put(reply, ["first", "second"], 1)
    versions.put(reply, ["first", "second", "third"], 0)
    assert versions.get(reply) == (["first", "second", "third"], 0)
    assert ReplyVersions(path).get(reply) == (["first", "second", "third"], 0)  # another connection sees it
    store.delete_chat(chat)  # ON DELETE CASCADE, through the chat's messages
    assert versions.get(reply) == ([], 0)
    versions.put(reply, ["a", "b"], 0)  # the message is gone: nothing to attach to, no error
    assert versions.get(reply) == ([], 0)
    store.close()
