"""`--model` for the commands that run a model: a file, or an installed model's id with the settings the
user gave it in the model manager (its chat template, its context, device and threads)."""
from __future__ import annotations


def resolve_model(model: str | None) -> str:
    """`--model`: a file or folder that exists, else an installed model's id; SystemExit naming both."""
    from pathlib import Path

    from engine.model_files.bundled import default_model_path

    if not model:
        return str(default_model_path())
    if Path(model).expanduser().exists():
        return str(Path(model).expanduser())
    from app.settings import Settings
    from app.store import ModelStore

    manifest = ModelStore(Settings.load().models_dir).get(model)
    if manifest is None:
        raise SystemExit(f"error: --model {model}: no such file, and no installed model has this id "
                         "(`ember models list` shows them)")
    return manifest.path


def installed_template(model: str | None) -> str | None:
    """The chat template the user set for an installed model named by id (the model manager's
    "Chat template…"), which replaces the file's own; --chat-template still wins."""
    from pathlib import Path

    from engine.model_files.manifest import chat_template_path, is_model_id

    if not model or not is_model_id(model) or Path(model).expanduser().exists():
        return None
    from app.settings import Settings

    p = chat_template_path(Settings.load().models_dir, model)
    return str(p) if p else None


def installed_load_settings(model: str | None):
    """The context, device and threads the user set for an installed model named by id."""
    from pathlib import Path

    from engine.model_files.load_settings import LoadSettings, read_load_settings
    from engine.model_files.manifest import is_model_id

    if not model or not is_model_id(model) or Path(model).expanduser().exists():
        return LoadSettings()
    from app.settings import Settings

    return read_load_settings(Settings.load().models_dir, model)


def installed_mmproj(model: str | None) -> str | None:
    """The projector an installed vision model named by id was imported or downloaded with (so
    `--model ID` sees images); --mmproj still wins."""
    from pathlib import Path

    from engine.model_files.manifest import is_model_id

    if not model or not is_model_id(model) or Path(model).expanduser().exists():
        return None
    from app.settings import Settings
    from app.store import ModelStore

    manifest = ModelStore(Settings.load().models_dir).get(model)
    return manifest.mmproj if manifest is not None else None
