"""A chat's images: attached with the picture button, pasted from the clipboard, or dropped on the
chat; shown as thumbnails above the message box until sent (each removable), then kept with the
message (app/history_images.py: files by hash in the history's folder) and shown small in the
transcript. A chat whose model has no vision projector says so before anything is sent: the button
is disabled with the reason as its tooltip, and a paste, drop or send of an image says it in a red
line above the message box."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QEvent, QIODevice, QObject, Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QLabel, QToolButton, QWidget

from app.history import HistoryError
from app.history_images import ImageError, ImageRef, is_image_path, sniff_mime
from app.model_kind import sees_images
from ui.chat_documents import RED, dropped_files
from ui.image_strip import TRANSCRIPT_PX, ImageStrip, thumbnail
from ui.resources import icon

ATTACH_TIP = "Attach images (PNG, JPEG, WebP) for the model to see; you can also paste or drop them"
FILTER = "Images (*.png *.jpg *.jpeg *.webp)"


def blind_words(name: str) -> str:
    return (f"{name} cannot see images: it has no vision projector (mmproj).\n"
            "Choose a vision model for this chat to send images.")


def png_bytes(image: QImage) -> bytes:
    buffer = QBuffer()
    buffer.open(QIODevice.WriteOnly)
    image.save(buffer, "PNG")
    return bytes(buffer.data())


def mime_images(mime) -> list[tuple[bytes, str]]:
    """The images a paste or drop carries: image files (read), else the picture itself (a screenshot
    copied to the clipboard), its PNG bytes as they came or encoded from the image."""
    files = [Path(u.toLocalFile()) for u in mime.urls() if u.isLocalFile()] if mime.hasUrls() else []
    found = [(p.read_bytes(), p.name) for p in files if is_image_path(p) and p.is_file()]
    if found or not mime.hasImage():
        return found
    raw = bytes(mime.data("image/png")) if "image/png" in mime.formats() else b""
    image = mime.imageData()
    return [(raw, "")] if raw else [(png_bytes(image), "")] if isinstance(image, QImage) and not image.isNull() else []


class ChatImages(QObject):
    def __init__(self, view: QWidget) -> None:
        super().__init__(view)
        self.view = view
        self.pending: list[tuple[bytes, str]] = []  # (bytes, file name) of each image not sent yet
        self._problem = ""  # what went wrong adding an image
        self._blind = ""  # that the model cannot see the images waiting
        self._model: str | None = None
        self._sees: bool | None = None
        self._thumbs: dict[str, QImage | None] = {}
        self.line = QLabel(view, textFormat=Qt.PlainText, wordWrap=True, objectName="chatImagesProblem")
        self.line.setStyleSheet(f"color: {RED}")
        self.line.hide()
        self.strip = ImageStrip(view)
        self.strip.removed.connect(self.remove)
        at = view.layout().indexOf(view.input)
        view.layout().insertWidget(at, self.line)
        view.layout().insertWidget(at + 1, self.strip)
        self.button = QToolButton(view, icon=icon("attach-image"), objectName="attachImageButton")
        self.button.setAccessibleName("Attach images")
        self.button.setFocusPolicy(Qt.TabFocus)
        self.button.clicked.connect(self.choose_files)
        view.buttons_row.insertWidget(2, self.button)
        view.input.images_pasted.connect(self.add_mime)
        view.actions.edit_requested.connect(self.put_back)
        for w in (view.input, view.transcript.viewport()):
            w.installEventFilter(self)  # after the documents' filter, so this one sees a drop first
        view.transcript.image_source = self.transcript_image
        view.engine.status_changed.connect(self.refresh)
        self.refresh()

    # ---- can the chat's model see? ----
    def model(self) -> str | None:
        try:
            own = self.view.chat_store.get_chat(self.view.chat_id).model
        except HistoryError:  # the chat was just deleted; its view goes at the next turn of the loop
            return None
        return own or self.view.engine.serving_model

    def can_see(self) -> bool | None:
        """True or False for an installed model (its manifest's projector); None when unknown (a
        remote server, a model served by path): then the server's answer decides."""
        model = self.model()
        if model != self._model:
            engine = self.view.engine
            self._model, self._sees = model, None if engine.is_remote else sees_images(engine.settings.models_dir,
                                                                                        model)
        return self._sees

    def refresh(self, *_: object) -> None:
        """The button and the line follow the chat's model (the status poll may bring a new one)."""
        blind = self.can_see() is False
        words = blind_words(self.view.engine.model_names.get(self._model, self._model)) if blind else ""
        self.button.setEnabled(not blind)
        self.button.setToolTip(words or ATTACH_TIP)
        self._blind = words if self.pending or self._blind else ""  # said until the model can see
        self._show()

    def image_uri(self):
        """How the request sends a message's images (None: as text alone, to a model that cannot see)."""
        return None if self.can_see() is False else self.view.chat_store.images.data_uri

    def ready_to_send(self) -> bool:
        """False (the reason shown) when images wait and the chat's model cannot see them."""
        self._model = None  # read the model's manifest again: it may have been paired since
        self.refresh()
        return not (self.pending and self._sees is False)

    # ---- adding and removing ----
    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.view, "Images for this message", "", FILTER)
        self.add_paths([Path(p) for p in paths])

    def add_paths(self, paths: list[Path]) -> None:
        images = []
        for p in paths:
            try:
                images.append((p.read_bytes(), p.name))
            except OSError as e:
                self._problem = f"{p.name}: {e.strerror or e}"
        self.add(images)

    def add_mime(self, mime) -> None:
        self.add(mime_images(mime))

    def add(self, images: list[tuple[bytes, str]]) -> None:
        """Put images under the message box; one that is not an image (or a blind model) says so instead."""
        if self.can_see() is False and images:
            self._blind = "…"  # refresh() words it
            self.refresh()
            return
        self._problem = ""
        for data, name in images:
            if sniff_mime(data) is None:
                self._problem = f"{name or 'The pasted data'}: not a PNG, JPEG or WebP image"
            else:
                self.pending.append((data, name))
        self.strip.set_images(self.pending)
        self._show()

    def put_back(self, _text: str, refs: list[ImageRef]) -> None:
        """A question taken back to edit keeps its images under the message box (those still on disk)."""
        folder = self.view.chat_store.images
        self.add([(data, r.name) for r in refs if (data := folder.read(r)) is not None])

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.pending):
            del self.pending[index]
            self._problem = ""
            self.strip.set_images(self.pending)
            self.refresh()

    def take(self) -> list[ImageRef]:
        """The pending images, kept in the history's folder, as the message's references; the row empties."""
        folder, refs = self.view.chat_store.images, []
        for data, name in self.pending:
            try:
                refs.append(folder.add(data, name))
            except (ImageError, OSError) as e:
                self._problem = str(e)
        if len(refs) == len(self.pending):
            self._problem = ""
        self.pending, self._blind = [], ""
        self.strip.set_images([])
        self._show()
        return refs

    def _show(self) -> None:
        text = (self._blind or self._problem).replace("\n", " ")
        self.line.setText(text)
        self.line.setVisible(bool(text))

    # ---- drops, and the transcript's pictures ----
    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt name
        kind = event.type()
        if kind in (QEvent.DragEnter, QEvent.DragMove, QEvent.Drop):
            paths = dropped_files(event)
            images = [p for p in paths if is_image_path(p)]
            if not images:
                return False  # other files go to the chat's documents (ui/chat_documents.py)
            event.acceptProposedAction()
            if kind == QEvent.Drop:
                self.add_paths(images)
                if others := [p for p in paths if not is_image_path(p)]:
                    self.view.docs.attach(others)
            return True
        return False

    def transcript_image(self, sha256: str) -> QImage | None:
        """A sent image's thumbnail for the transcript (read once per chat view)."""
        if sha256 not in self._thumbs:
            ref = next((r for m in self.view.transcript.messages for r in m.images if r.sha256 == sha256), None)
            data = self.view.chat_store.images.read(ref) if ref is not None else None
            self._thumbs[sha256] = thumbnail(data, TRANSCRIPT_PX) if data else None
        return self._thumbs[sha256]
