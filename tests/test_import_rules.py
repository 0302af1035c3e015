"""The import rules of DESIGN.md, checked by parsing every .py file under engine/, ui/ and app/ with ast,
and by importing the GUI's modules in a fresh interpreter.

- engine imports nothing from app or ui, and no Qt;
- ui imports no torch or llama_cpp, and of engine only its torch-free model-file facts
  (SHARED_ENGINE: the GGUF header, manifest, bundled model, footprint and fit rule, a reply's citations);
- app imports Qt only in app/gui_main.py (and app/bench/soak_gui.py, the bench that drives the
  real window in its own process), and ui only from gui_main;
- the GUI's path (app/gui_main.py, ui/ and every project module they import, transitively)
  reaches no torch or llama_cpp, and no engine module but SHARED_ENGINE;
- the engine core (sequence, block_manager, scheduler, llm_engine, output_processor, runner) imports no torch.
Imports inside functions count too: ast.walk sees them all (but those under `if TYPE_CHECKING:`,
which never run).
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "ui", "app")
QT = {"PySide6", "PySide2", "PyQt5", "PyQt6", "qtpy", "shiboken6", "superqt"}
HEAVY = {"torch", "llama_cpp"}
GUI_ENTRY = "app.gui_main"
GUI_BENCH = "app.bench.soak_gui"  # builds the app through GUI_ENTRY and drives it: Qt, but no ui import
# The engine's modules the GUI's path may import: model-file facts, one definition for app, ui and engine.
SHARED_ENGINE = ("engine.model_files", "engine.model_files.gguf_file", "engine.model_files.meta",
                 "engine.model_files.manifest", "engine.model_files.load_settings", "engine.model_files.bundled",
                 "engine.model_files.chat_layout",
                 "engine.model_files.fit",
                 "engine.model_files.footprint", "engine.model_files.memory", "engine.model_files.tool_call_syntax",
                 "engine.model_files.errors", "engine.model_files.projector",
                 "engine.model_files.quant_config", "engine.model_files.architectures",
                 "engine.model_files.families", "engine.model_files.safetensors_file",
                 "engine.model_files.bert_folder", "engine.model_files.bert_gguf",
                 "engine.kernel_library", "engine.kernel_paths", "engine.keep_alive",
                 "engine.docs", "engine.docs.sources",
                 # the KV disk tier's folders, torch-free: the model manager's Delete forgets a model's blocks
                 "engine.kv_disk", "engine.kv_disk.folders", "engine.kv_disk.lock", "engine.kv_disk.block_file")


def shared(name: str) -> bool:
    """`engine` itself (an empty package), one of SHARED_ENGINE, or a name imported from one of its
    modules (a module of the package that is not listed is not shared)."""
    parent = name.rpartition(".")[0]
    return name in ("engine", *SHARED_ENGINE) or (parent in SHARED_ENGINE and parent != SHARED_ENGINE[0])


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> set[str]:
    """Full dotted names imported by a file (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mod = module_name(root, path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    typing_only = {id(n) for branch in ast.walk(tree) if isinstance(branch, ast.If) and _type_checking(branch.test)
                   for stmt in branch.body for n in ast.walk(stmt)}  # never run: names for annotations only
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            out.add(prefix)
            out.update(f"{prefix}.{alias.name}" for alias in node.names if alias.name != "*")
    return {name for name in out if name}


def _type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def top(name: str) -> str:
    return name.split(".")[0]


def scan(root: Path) -> dict[str, set[str]]:
    """module name -> imported names, for every .py file of the three packages under `root`."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else ():
            if ".venv" in path.parts or "__pycache__" in path.parts:
                continue
            graph[module_name(root, path)] = imports_of(root, path)
    return graph


def violations(root: Path) -> list[str]:
    graph = scan(root)
    found: list[str] = []
    for mod, names in graph.items():
        tops = {top(n) for n in names}
        if mod.startswith("engine"):
            found += [f"{mod} imports {t} (engine must not import app, ui or Qt)"
                      for t in sorted(tops & ({"app", "ui"} | QT))]
        elif mod.startswith("ui"):
            found += [f"{mod} imports {t} (ui reaches the engine only through app.client)"
                      for t in sorted(tops & HEAVY)]
            found += [f"{mod} imports {n} (of engine, ui may use only {', '.join(SHARED_ENGINE)})"
                      for n in sorted(names) if top(n) == "engine" and not shared(n)]
        elif mod.startswith("app") and mod != GUI_ENTRY:
            found += [f"{mod} imports {t} (only {GUI_ENTRY} may import Qt)" for t in sorted(tops & QT)
                      if mod != GUI_BENCH]
            found += [f"{mod} imports ui (only {GUI_ENTRY} may)" for _ in (tops & {"ui"})]
    # the GUI's path: everything reachable from app.gui_main and ui/ through project imports
    start = [m for m in graph if m == GUI_ENTRY or top(m) == "ui"]
    seen, stack, via = set(start), list(start), {m: m for m in start}
    while stack:
        mod = stack.pop()
        for name in graph.get(mod, ()):
            if top(name) in HEAVY or (top(name) == "engine" and not shared(name)):
                found.append(f"GUI path reaches {name}: {via[mod]} -> ... -> {mod}")
                continue
            # `from app import client` names app.client; `import app.history` names app.history
            for target in (name, name.rpartition(".")[0]):
                if target in graph and target not in seen and top(target) in PACKAGES:
                    seen.add(target)
                    via[target] = via[mod]
                    stack.append(target)
    return found


def test_the_project_follows_the_import_rules():
    assert scan(ROOT), "no modules found"
    assert [v for v in violations(ROOT) if not v.startswith("GUI path")] == []


def test_the_gui_path_reaches_no_torch_llama_cpp_or_engine_beyond_its_model_file_facts():
    """DESIGN.md: app may import engine for in-process CLI commands; the GUI's path only its
    torch-free model-file facts."""
    assert [v for v in violations(ROOT) if v.startswith("GUI path")] == []


def loaded_after_importing(modules: list[str], tops: tuple[str, ...]) -> list[str]:
    """The modules under `tops` that importing `modules` loads, in a fresh interpreter (so
    everything they pull in transitively, third-party packages included, counts)."""
    script = (f"import json, sys\nfor m in {modules!r}:\n    __import__(m)\n"
              f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {tops!r})))")
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_importing_the_gui_pulls_in_no_torch_or_llama_cpp():
    """app.gui_main and every ui module: no torch, no llama_cpp, and of engine only SHARED_ENGINE."""
    modules = [GUI_ENTRY] + sorted(m for m in scan(ROOT) if top(m) == "ui")
    loaded = loaded_after_importing(modules, ("torch", "llama_cpp", "engine"))
    assert not [m for m in loaded if top(m) in HEAVY], loaded
    assert set(loaded) - {"engine"} <= set(SHARED_ENGINE), loaded
    assert "engine.model_files.fit" in loaded  # the badge's rule is the engine's, imported for real


def test_the_shared_engine_modules_import_no_torch_llama_cpp_or_qt():
    """Each of SHARED_ENGINE alone, so none leans on another having been imported first."""
    for mod in SHARED_ENGINE:
        assert loaded_after_importing([mod], ("torch", "llama_cpp", "PySide6")) == [], mod


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    _write(tmp_path, {
        "engine/__init__.py": "",
        "engine/bad.py": "from app.settings import Settings\n",
        "engine/qt.py": "def f():\n    from PySide6 import QtCore\n",  # inside a function still counts
        "engine/backends/__init__.py": "import torch\n",
        "engine/model_files/__init__.py": "",
        "engine/model_files/fit.py": "import math\n",
        "engine/model_files/meta.py": "from engine.loaders import gguf_loader\n",  # a shared module gone heavy
        "ui/__init__.py": "",
        "ui/view.py": "import torch\nfrom ..app import client\n",
        "ui/ok.py": "from app.helper import x\n",
        "ui/facts.py": "from engine.model_files.fit import choose_backend\n",  # the shared facts: allowed
        "ui/unlisted.py": "from engine.model_files import heavy\n",
        "ui/engine_use.py": "from engine.backends import decide\n",
        "app/__init__.py": "",
        "app/gui_main.py": "from PySide6.QtWidgets import QApplication\nimport ui.view\n",
        "app/helper.py": "from . import deep\nfrom engine.model_files import meta\n",
        "app/deep.py": "import llama_cpp\n",
        "app/cli_x.py": "import ui.view\nfrom PySide6 import QtGui\nimport engine.backends\n",  # fine off the GUI path
    })
    found = "\n".join(violations(tmp_path))
    assert "engine.bad imports app" in found
    assert "engine.qt imports PySide6" in found
    assert "ui.view imports torch" in found
    assert "ui.engine_use imports engine.backends" in found and "GUI path reaches engine.backends" in found
    assert "ui.facts" not in found  # engine's model-file facts are shared with ui
    assert "ui.unlisted imports engine.model_files.heavy" in found  # only the modules SHARED_ENGINE names
    assert "app.cli_x imports PySide6" in found and "app.cli_x imports ui" in found
    assert "GUI path reaches llama_cpp" in found and "app.deep" in found  # ui.ok -> app.helper -> app.deep
    assert "GUI path reaches engine.loaders" in found  # ui.ok -> app.helper -> engine.model_files.meta -> ...
    assert "app.gui_main imports" not in found  # the entry point may import Qt and ui
    assert "app.cli_x imports engine" not in found


def test_relative_imports_resolve(tmp_path):
    _write(tmp_path, {"engine/server/app.py": "from ..layers import attention\nfrom . import auth\n"})
    names = imports_of(tmp_path, tmp_path / "engine/server/app.py")
    assert {"engine.layers", "engine.layers.attention", "engine.server", "engine.server.auth"} <= names


def test_the_engine_core_imports_no_torch():
    """DESIGN.md's table: the core imports no torch, runners do. Each module is imported alone in
    a fresh interpreter, so whatever it pulls in transitively counts."""
    import subprocess
    import sys

    for mod in ("engine.sequence", "engine.block_manager", "engine.scheduler", "engine.scheduler_output",
                "engine.llm_engine", "engine.output_processor", "engine.runner", "engine.speculative.speculator",
                "engine.speculative.ngram", "engine.speculative.goodput", "engine.speculative.vocab_check"):
        code = f"import sys, {mod}; print('torch' in sys.modules)"
        run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "False", f"{mod} imports torch"
