"""docs/ARCHITECTURE.md cannot go stale silently: every path it names in backticks exists, every
package it should map is named there, and every package says what it holds in its __init__.py."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
DOC = ROOT / "docs" / "ARCHITECTURE.md"
ROOMS = ("engine", "app", "ui", "packaging", "tools", "tests", "resources", "docs")
PACKAGES = ("engine", "app", "ui")
# a backticked path into one of the rooms: `engine/server/chat.py`, `engine/server/openai/`
PATH = re.compile(r"`((?:%s)/[\w./-]*)`" % "|".join(ROOMS))


def named_paths(text: str) -> set[str]:
    return {m.group(1) for m in PATH.finditer(text)}


def packages() -> list[Path]:
    """Every package directory (one with an __init__.py) under engine/, app/ and ui/."""
    return sorted(init.parent for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")
                  if "__pycache__" not in init.parts)


def test_the_doc_names_paths():
    assert len(named_paths(DOC.read_text(encoding="utf-8"))) > 50


def test_every_path_the_doc_names_exists():
    missing = sorted(p for p in named_paths(DOC.read_text(encoding="utf-8")) if not (ROOT / p).exists())
    assert missing == [], f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_subpackage_is_on_the_map():
    """A new package under engine/, app/ or ui/ gets its room in the doc (as `its/path/`)."""
    text = DOC.read_text(encoding="utf-8")
    unnamed = [str(p.relative_to(ROOT)) for p in packages()
               if p.parent != ROOT and f"`{p.relative_to(ROOT).as_posix()}/`" not in text]
    assert unnamed == [], f"packages missing from docs/ARCHITECTURE.md: {unnamed}"


def test_every_package_says_what_it_holds():
    silent = [str(p.relative_to(ROOT)) for p in packages()
              if not ast.get_docstring(ast.parse((p / "__init__.py").read_text(encoding="utf-8")))]
    assert silent == [], f"packages whose __init__.py has no docstring: {silent}"
