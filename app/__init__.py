"""The application around the engine, with Qt only where the GUI starts (gui_main.py; the GUI soak
bench): the `ember` CLI, settings, the model store, catalog and downloads, the engine supervisor,
the one HTTP client of the engine, chat history."""
