"""CLI flags generated from the Settings fields (llama-cpp-python's add_args_from_model): a
`--field-name` per field, typed from its annotation, and the flags typed laid over the loaded settings
(per run, like env values: never written back unless changed later)."""
from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from app.settings import Settings


def add_settings_args(parser: argparse.ArgumentParser, fields: typing.Iterable[str] | None = None,
                      flags: typing.Mapping[str, str] | None = None) -> None:
    """Add `--field-name` options for `fields` (default: all); `flags` renames some, e.g. {"server_port": "--port"}.

    Defaults are suppressed, so only the flags the user typed override the loaded settings.
    """
    flags = flags or {}
    names = list(fields) if fields is not None else list(Settings.model_fields)
    for name in names:
        field = Settings.model_fields[name]  # KeyError for an unknown field: a programming error
        flag = flags.get(name, "--" + name.replace("_", "-"))
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": field.description}
        base = _base_type(field.annotation)
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(base) is Literal:
            kwargs["choices"] = list(typing.get_args(base))
        elif base in (int, float):
            kwargs["type"] = base
            kwargs["metavar"] = "N" if base is int else "X"
        else:
            kwargs["metavar"] = "PATH" if base is Path else name.split("_")[-1].upper()
        parser.add_argument(flag, **kwargs)


def settings_from_args(args: argparse.Namespace, base: Settings | None = None) -> Settings:
    """Settings loaded as usual (file + env), then the CLI flags present in `args` on top (validated)."""
    settings = base if base is not None else Settings.load()
    given = {name: getattr(args, name) for name in Settings.model_fields if hasattr(args, name)}
    if not given:
        return settings
    try:
        merged = Settings.model_validate({**settings.model_dump(), **given})
    except ValidationError as e:
        errors = "; ".join(f"--{str(err['loc'][0]).replace('_', '-')}: {err['msg']}" for err in e.errors())
        raise ValueError(f"invalid option: {errors}") from None
    merged._path = settings._path
    merged._env_overrides = dict(settings._env_overrides)
    for name in given:  # CLI values are per-run, like env values: never written back unless changed later
        file_value = settings._env_overrides[name][0] if name in settings._env_overrides else getattr(settings, name)
        merged._env_overrides[name] = (file_value, getattr(merged, name))
    return merged


def _base_type(annotation: Any) -> Any:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation
