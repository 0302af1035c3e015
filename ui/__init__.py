"""The desktop app's PySide6 widgets (window, chats, transcript, model manager, settings, tray) and
the workers that run Qt-free work off the GUI thread; the engine only through app.client."""
