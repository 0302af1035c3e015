"""`ember models ...` in-process: import, list (with fit), search, verify, rm, and clear errors."""
from __future__ import annotations

import json

import pytest

from app.cli import main
from store_helpers import write_tiny_gguf


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "home"))
    return tmp_path


def run(capsys, *argv):
    rc = main(["models", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_import_list_verify_rm(home, capsys):
    src = write_tiny_gguf(home / "tiny.gguf", name="Cli Tiny")
    rc, out, _ = run(capsys, "import", str(src), "--id", "cli-tiny")
    assert rc == 0 and "imported cli-tiny (llama, F32" in out
    rc, out, _ = run(capsys, "list", "--json")
    rows = {m["id"]: m for m in json.loads(out)}
    assert rc == 0 and rows["cli-tiny"]["fit"]["fits"] is True and rows["cli-tiny"]["architecture"] == "llama"
    rc, out, _ = run(capsys, "list")
    assert "cli-tiny" in out and "FIT" in out.splitlines()[0]
    assert run(capsys, "verify", "cli-tiny")[:2] == (0, "cli-tiny: OK\n")
    models_dir = home / "home" / "data" / "models"
    with open(next((models_dir / "cli-tiny").glob("*.gguf")), "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x00")
    rc, out, _ = run(capsys, "verify", "cli-tiny")
    assert rc == 1 and "FAILED" in out
    rc, out, _ = run(capsys, "rm", "cli-tiny")
    assert rc == 0 and not (models_dir / "cli-tiny").exists()
    assert run(capsys, "rm", "cli-tiny")[0] == 1


def test_import_of_a_broken_file_says_why(home, capsys):
    bad = home / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 100)
    rc, _, err = run(capsys, "import", str(bad))
    assert rc == 1 and "corrupt or truncated GGUF" in err


def test_search_and_pull_errors(home, capsys):
    rc, out, _ = run(capsys, "search", "coder", "--json")
    ids = [e["id"] for e in json.loads(out)]
    assert rc == 0 and ids == ["qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m",
                               "qwen3-coder-30b-a3b-instruct-q4_k_m"]
    rc, _, err = run(capsys, "pull", "qwen2.5-coder")
    assert rc == 2 and "not in the catalog" in err and "qwen2.5-coder-0.5b-instruct-q4_k_m" in err
