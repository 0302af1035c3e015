"""The server's layers (docs/ARCHITECTURE.md), checked by parsing engine/ with ast:

- each wire protocol is one package under engine/server/ (every subpackage there is one), and no
  module outside a protocol's package imports one of its private names (`_x`): what others use
  is public;
- engine/server/ is the HTTP side only: none of its modules imports the engine thread
  (engine.service.engine_thread) or builds an EngineThread. Whoever runs the process
  (engine/serve.py, a test) builds the thread and hands it to create_app.
Imports inside functions count too: ast.walk sees them all.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = "engine.server"
PROTOCOLS = ("openai", "ollama", "anthropic")  # at least these; a new one is found by itself
ENGINE_THREAD = "engine.service.engine_thread"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(root: Path, path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every import in a file: `from m import n` gives (m, n), `import m` gives
    (m, None); relative imports resolved against the file's package."""
    mod = module_name(root, path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            out += [(base, alias.name) for alias in node.names]
    return out


def calls(path: Path) -> set[str]:
    """The names a file calls (`f(...)` and `x.f(...)` both give f)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            found.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return found


def protocols(root: Path) -> set[str]:
    """The wire-protocol packages: the subpackages of engine/server/."""
    return {p.parent.name for p in (root / "engine" / "server").glob("*/__init__.py")}


def protocol_of(mod: str, names: set[str]) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and ".".join(parts[:2]) == SERVER and parts[2] in names else None


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(root: Path) -> list[str]:
    found: list[str] = []
    names = protocols(root)
    for path in sorted((root / "engine").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        mod = module_name(root, path)
        own = protocol_of(mod, names)
        for source, name in imported_names(root, path):
            target = f"{source}.{name}" if name else source
            theirs = protocol_of(target, names)
            if theirs and theirs != own and any(private(p) for p in target.split(".")[3:]):
                found.append(f"{mod} imports {target}, a private name of the {theirs} package")
            if mod.startswith(SERVER) and (target == ENGINE_THREAD or target.startswith(ENGINE_THREAD + ".")):
                found.append(f"{mod} imports {target}: engine/server/ must not own the engine thread")
        if mod.startswith(SERVER) and "EngineThread" in calls(path):
            found.append(f"{mod} builds an EngineThread: engine/server/ must not own the engine thread")
    return found


def test_the_wire_protocols_are_packages():
    assert set(PROTOCOLS) <= protocols(ROOT)


def test_the_server_keeps_its_layers():
    assert violations(ROOT) == []


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    files = {
        "engine/__init__.py": "",
        "engine/server/__init__.py": "",
        "engine/server/chat.py": "def start_chat(): ...\n",
        "engine/server/openai/__init__.py": "",
        "engine/server/openai/protocol.py": "def _helper(): ...\nX = 1\n",
        # a package's own private names are its own
        "engine/server/openai/routes.py": "from ._private_mod import y\nfrom .protocol import _helper\n",
        "engine/server/ollama/__init__.py": "",
        "engine/server/ollama/routes.py": ("from engine.server.openai.protocol import X, _helper\n"
                                           "from engine.server.chat import start_chat\n"),
        "engine/server/anthropic/__init__.py": "",
        "engine/server/anthropic/routes.py": "def f():\n    from ..openai import _private_mod\n",  # lazy counts
        "engine/server/app.py": "from engine.service.engine_thread import EngineThread\n",
        "engine/server/admin.py": "from engine.service import engine_thread\nt = engine_thread.EngineThread(f)\n",
        "engine/serve.py": "from engine.service.engine_thread import EngineThread\nEngineThread(f)\n",  # fine here
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    found = "\n".join(violations(tmp_path))
    assert "engine.server.ollama.routes imports engine.server.openai.protocol._helper" in found
    assert "engine.server.anthropic.routes imports engine.server.openai._private_mod" in found
    assert "engine.server.openai.routes" not in found  # a package's own private names are its own
    assert "engine.server.openai.protocol.X" not in found and "start_chat" not in found
    assert "engine.server.app imports engine.service.engine_thread.EngineThread" in found
    assert "engine.server.admin imports engine.service.engine_thread" in found
    assert "engine.server.admin builds an EngineThread" in found
    assert "engine.serve " not in found  # the process's entry point builds the thread
