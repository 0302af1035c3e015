"""The house limits hold over the source tree (tools/house_check.py: no file over 300 lines, no
function over 60, no import circle, lazy imports counted), and the checker sees each breach."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("house_check", ROOT / "tools" / "house_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_keeps_the_house_limits():
    assert _checker().breaches(ROOT) == []


def test_the_checker_sees_a_long_file_a_long_function_and_a_circle(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (pkg / "a.py").write_text(f"from pkg import b\n\n\ndef long():\n{body}\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import long\n    return long\n" + "\n" * 300)
    found = _checker().breaches(tmp_path)
    assert any(f.startswith("function pkg/a.py:4 long: 62 lines") for f in found), found
    assert any(f.startswith("file pkg/b.py:") for f in found), found
    assert "import circle: pkg.a <-> pkg.b" in found, found
