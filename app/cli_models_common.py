"""What the `ember models` actions share: the settings they read, the store, and the table text."""
from __future__ import annotations

from typing import TYPE_CHECKING

from app.settings import Settings
from app.settings_args import settings_from_args

if TYPE_CHECKING:
    from app.store import ModelStore

SETTINGS_FIELDS = ["data_dir", "models_dir", "hub_base_url", "max_parallel_downloads"]


def setup(args) -> tuple[Settings, ModelStore]:
    from app.store import ModelStore

    settings = settings_from_args(args)
    return settings, ModelStore(settings.models_dir)


def catalog(args, settings):
    from app.catalog import Catalog

    return Catalog.load(getattr(args, "catalog", None), hub_base_url=settings.hub_base_url)


def size_text(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def fit_text(advice) -> str:
    if not advice.fits:
        return "does not fit"
    return f"{advice.device}: {advice.max_context} ctx × {advice.max_parallel} chats"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
