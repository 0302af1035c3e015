"""Ember's version: the installed package's metadata (one source: pyproject.toml)."""
from __future__ import annotations

from importlib import metadata


def ember_version() -> str:
    try:
        return metadata.version("ember")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
