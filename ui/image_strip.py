"""The images waiting to be sent, as a row of thumbnails above the message box, each with a × that
takes it out; and `thumbnail`, the small picture of an image's bytes that the row and the transcript
show."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QToolButton, QWidget

STRIP_PX = 64  # a pending image's thumbnail, at most this wide and high
TRANSCRIPT_PX = 160  # a sent image's, in the transcript


def thumbnail(data: bytes, size: int) -> QImage | None:
    """The image scaled to fit `size` x `size` (never enlarged); None when Qt cannot decode it."""
    image = QImage.fromData(data)
    if image.isNull():
        return None
    if image.width() > size or image.height() > size:
        image = image.scaled(QSize(size, size), Qt.KeepAspectRatio, Qt.SmoothTransformation)
    return image


class ImageStrip(QWidget):
    """`removed(index)` when the × of the image at `index` is clicked; `set_images` draws the row."""

    removed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pendingImages")
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(4, 4, 4, 0)
        self._row.setSpacing(6)
        self._row.addStretch(1)
        self.tiles: list[QFrame] = []
        self.hide()

    def set_images(self, images: list[tuple[bytes, str]]) -> None:
        """Show `images` ((bytes, name) each) in order; hidden when there are none."""
        for tile in self.tiles:
            self._row.removeWidget(tile)
            tile.deleteLater()
        self.tiles = [self._tile(i, data, name) for i, (data, name) in enumerate(images)]
        for i, tile in enumerate(self.tiles):
            self._row.insertWidget(i, tile)
        self.setVisible(bool(images))

    def _tile(self, index: int, data: bytes, name: str) -> QFrame:
        tile = QFrame(self, objectName="pendingImage", frameShape=QFrame.StyledPanel)
        tile.setToolTip(name or "Pasted image")
        layout = QGridLayout(tile)  # the × over the picture's corner: both in the one cell
        layout.setContentsMargins(2, 2, 2, 2)
        remove = QToolButton(tile, text="×", objectName="removeImage", autoRaise=True)
        remove.setToolTip(f"Remove {name or 'this image'}")
        remove.setAccessibleName(f"Remove {name or 'image'}")
        remove.setFocusPolicy(Qt.TabFocus)
        remove.setStyleSheet("QToolButton { background: palette(base); border-radius: 9px; padding: 0 4px; }")
        remove.clicked.connect(lambda: self.removed.emit(index))
        picture = QLabel(tile, objectName="pendingImagePicture", alignment=Qt.AlignCenter)
        image = thumbnail(data, STRIP_PX)
        picture.setFixedSize(STRIP_PX, STRIP_PX)
        if image is not None:
            picture.setPixmap(QPixmap.fromImage(image))
        else:
            picture.setText("?")
        picture.setAccessibleName(name or "Pasted image")
        layout.addWidget(picture, 0, 0)
        layout.addWidget(remove, 0, 0, Qt.AlignTop | Qt.AlignRight)
        remove.raise_()
        return tile
