"""One running Ember per user and home: a second launch asks the first to raise its window and exits."""
from __future__ import annotations

import getpass
import hashlib

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

CONNECT_TIMEOUT_MS = 500


def instance_key(home: str) -> str:
    """A local-socket name per user and data home (tests with their own EMBER_HOME do not collide)."""
    digest = hashlib.sha256(f"{getpass.getuser()}:{home}".encode()).hexdigest()[:16]
    return f"ember-{digest}"


class SingleInstance(QObject):
    """`acquire()` is True for the first instance; later ones send "raise" and get False.

    `activated` fires in the first instance each time a later launch knocks.
    """

    activated = Signal()

    def __init__(self, key: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.server: QLocalServer | None = None

    def acquire(self) -> bool:
        socket = QLocalSocket(self)
        socket.connectToServer(self.key)
        if socket.waitForConnected(CONNECT_TIMEOUT_MS):
            socket.write(b"raise\n")
            socket.flush()
            socket.waitForBytesWritten(CONNECT_TIMEOUT_MS)
            socket.disconnectFromServer()
            return False
        QLocalServer.removeServer(self.key)  # a stale socket file left by a crashed instance
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.UserAccessOption)
        if not self.server.listen(self.key):
            raise RuntimeError(f"cannot listen on local socket {self.key}: {self.server.errorString()}")
        self.server.newConnection.connect(self._on_new_connection)
        return True

    def release(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _on_new_connection(self) -> None:
        while self.server is not None and self.server.hasPendingConnections():
            conn = self.server.nextPendingConnection()
            conn.readyRead.connect(conn.readAll)
            conn.disconnected.connect(conn.deleteLater)
            self.activated.emit()
