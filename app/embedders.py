"""Which installed models can index documents (embedding-only models), and what a chat with files
should tell the user before sending when there is none. Qt-free."""
from __future__ import annotations

from app.settings import Settings
from app.store import ModelStore
from engine.model_files.architectures import embeds_only

NO_EMBEDDER = ("No embedding model is installed, and this chat's files need one to be searched. Install one "
               "in the Model manager (Models → Model manager…: all-MiniLM-L6-v2 or another embedding model), "
               "or import a sentence-transformers folder with `ember models import FOLDER`; then send again.")


def embedding_models(store: ModelStore) -> list[tuple[str, str]]:
    """(id, name) of each installed embedding-only model."""
    return [(m.id, m.name) for m in store.list() if embeds_only(m.architecture)]


def embedder_problem(settings: Settings) -> str | None:
    """Why documents cannot be searched with these settings, in words with what to do; None when they can."""
    models = embedding_models(ModelStore(settings.models_dir))
    if not models:
        return NO_EMBEDDER
    chosen = settings.embedding_model
    if chosen and chosen not in {i for i, _ in models} and chosen not in {n for _, n in models}:
        return (f"The embedding model chosen in Settings ({chosen}) is not installed. Choose an installed one "
                "in Settings → Documents, or install it in the Model manager; then send again.")
    return None
