"""The list of chats: search, new, rename, delete. Reads and writes through app.history.ChatStore."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QInputDialog, QLineEdit, QListWidget, QListWidgetItem,
                               QMessageBox, QPushButton, QVBoxLayout, QWidget)

from app.history import ChatStore
from ui.chat_view import DEFAULT_TITLE

ITEM_HEIGHT = 30


class ChatListPanel(QWidget):
    """`chat_selected(id)` when the user picks a chat; `chat_deleted(id)` after one is removed."""

    chat_selected = Signal(int)
    chat_deleted = Signal(int)

    def __init__(self, chat_store: ChatStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.chat_store = chat_store
        self.streaming: set[int] = set()  # chats whose reply is streaming now (marked in the list)
        self.search = QLineEdit(self, placeholderText="Search chats…", clearButtonEnabled=True)
        self.list = QListWidget(self, objectName="chatList")
        self.new_button = QPushButton("New chat", self)
        self.rename_button = QPushButton("Rename", self)
        self.delete_button = QPushButton("Delete", self)

        row = QHBoxLayout()
        row.addWidget(self.rename_button)
        row.addWidget(self.delete_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 0, 6)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(row)

        self.search.textChanged.connect(self.refresh)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.new_button.clicked.connect(self.new_chat)
        self.rename_button.clicked.connect(self._on_rename_clicked)
        self.delete_button.clicked.connect(self._on_delete_clicked)
        self.refresh()

    def current_chat_id(self) -> int | None:
        item = self.list.currentItem()
        return item.data(Qt.UserRole) if item is not None else None

    def refresh(self) -> None:
        """Rebuild the list from the store (newest first, as the store orders it), keeping the selection."""
        current = self.current_chat_id()
        self.list.blockSignals(True)
        self.list.clear()
        for chat in self.chat_store.list_chats(search=self.search.text().strip() or None):
            item = QListWidgetItem()
            item.setData(Qt.UserRole, chat.id)
            self._label(item, chat.title)
            item.setSizeHint(QSize(0, ITEM_HEIGHT))
            self.list.addItem(item)
            if chat.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)

    def set_streaming(self, chat_id: int, streaming: bool) -> None:
        """Mark a chat whose reply is streaming (several can be at once), in place: the list keeps its
        order under the pointer while chats reply (it is sorted newest first when it is rebuilt)."""
        (self.streaming.add if streaming else self.streaming.discard)(chat_id)
        self.update_title(chat_id)

    def update_title(self, chat_id: int) -> None:
        """A chat's row says its current title (and whether it is replying), without moving it."""
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(Qt.UserRole) == chat_id:
                self._label(item, self.chat_store.get_chat(chat_id).title)

    def _label(self, item: QListWidgetItem, title: str | None) -> None:
        title = title or DEFAULT_TITLE
        replying = item.data(Qt.UserRole) in self.streaming
        item.setText(("● " if replying else "") + title)
        item.setToolTip(title + ("  (replying…)" if replying else ""))

    def select(self, chat_id: int) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(Qt.UserRole) == chat_id:
                self.list.setCurrentRow(i)
                return

    def new_chat(self) -> int:
        chat_id = self.chat_store.create_chat(DEFAULT_TITLE)
        self.search.clear()
        self.refresh()
        self.select(chat_id)
        return chat_id

    def rename(self, chat_id: int, title: str) -> None:
        title = " ".join(title.split())
        if title:
            self.chat_store.rename_chat(chat_id, title)
            self.refresh()

    def delete(self, chat_id: int) -> None:
        self.chat_store.delete_chat(chat_id)
        self.refresh()
        self.chat_deleted.emit(chat_id)
        if self.list.count() and self.list.currentItem() is None:
            self.list.setCurrentRow(0)

    def _on_current_changed(self, current: QListWidgetItem | None, _previous: QListWidgetItem | None) -> None:
        self.rename_button.setEnabled(current is not None)
        self.delete_button.setEnabled(current is not None)
        if current is not None:
            self.chat_selected.emit(current.data(Qt.UserRole))

    def _on_rename_clicked(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=item.text())
        if ok:
            self.rename(item.data(Qt.UserRole), title)

    def _on_delete_clicked(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{item.text()}” and all its messages?")
        if answer == QMessageBox.Yes:
            self.delete(item.data(Qt.UserRole))
