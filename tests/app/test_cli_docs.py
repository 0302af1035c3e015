"""`ember docs add|list|rm|search` and `ember chat --docs`, as a user runs them (app.cli.main in
this process; a real `python -m app docs add` child for Ctrl-C), on the real all-MiniLM-L6-v2
(imported as `ember models import` does) and the tests' documents set (tests/docs_kit.py: facts no
model knows in PDF, DOCX, PPTX, Markdown and code, beside distractors).

Oracles we did not write: pypdf, markitdown, SQLite's FTS5, sqlite-vec, llama.cpp and the real MiniLM
(the right file on top is the retrieval's answer, not ours).
"""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from docs_kit import QUESTIONS, minilm_store, write_corpus

from app.cli import main
from app.cli_chat_docs import DocsChat
from app.docs_local import open_store
from app.settings import Settings
from engine.docs.retrieve import Hit
from engine.docs.sources import INSTRUCTION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("docs-home")
    minilm_store(home / "data" / "models")
    return home


@pytest.fixture
def ember_home(home, monkeypatch) -> Path:
    monkeypatch.setenv("EMBER_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def kit(home, tmp_path_factory) -> Path:
    """The kit's corpus indexed into the collection `kit` (once for the module)."""
    corpus = tmp_path_factory.mktemp("kit")
    write_corpus(corpus)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBER_HOME", str(home))
        assert main(["docs", "add", "kit", str(corpus)]) == 0
    return corpus


def docs(*argv: str) -> int:
    return main(["docs", *argv])


def chunks_of(path: Path) -> int:
    store = open_store(Settings.load())
    f = store.file_by_path(path.resolve())
    n = 0 if f is None else store.db.execute("SELECT COUNT(*) FROM chunks WHERE file_id=?", (f.id,)).fetchone()[0]
    store.close()
    return n


@pytest.mark.parametrize("q", QUESTIONS, ids=[q.filename for q in QUESTIONS])
def test_search_puts_the_file_that_answers_on_top(kit, ember_home, capsys, q):
    capsys.readouterr()
    assert docs("search", "kit", q.text, "-k", "3") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"1. {q.filename}"), lines
    assert q.fact in lines[1]  # the snippet shows the passage that holds the fact
    assert sum(line[:3] in ("1. ", "2. ", "3. ") for line in lines) == 3


def test_list_shows_collections_and_files(kit, ember_home, capsys):
    capsys.readouterr()
    assert docs("list") == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kit "))
    assert row.split()[1:3] == [str(len(list(kit.iterdir()))), "0"] and "all-minilm" in row
    assert docs("list", "kit") == 0
    out = capsys.readouterr().out
    assert all(f"{p.name} " in out for p in kit.iterdir()) and out.count("completed") == len(list(kit.iterdir()))
    assert docs("list", "no-such") == 1


def test_bm25_and_vector_modes_search_alone(kit, ember_home, capsys):
    for mode in ("bm25", "vector"):
        capsys.readouterr()
        assert docs("search", "kit", "Grandma Irelle plum cake rye flour", "--mode", mode, "-k", "1") == 0
        assert capsys.readouterr().out.startswith("1. recipes.md")


def test_adding_again_skips_unchanged_reindexes_changed_and_drops_gone_files(ember_home, tmp_path, capsys):
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("The orchard keeper Tobiah Wrenfield planted forty pear trees.")
    (folder / "sub" / "b.md").write_text("# Boats\n\nThe ferry Calloway Star sails at nine.\n")
    (folder / "c.txt").write_text("The museum on Pellham Road opens on Sundays only.")
    (folder / ".hidden.txt").write_text("not indexed: hidden")
    (folder / "image.png").write_bytes(b"\x89PNG not a document")
    assert docs("add", "notes", str(folder)) == 0
    out = capsys.readouterr().out
    assert out.count("indexed, 1 chunk") == 3 and "hidden" not in out and "image.png" not in out

    assert docs("add", "notes", str(folder)) == 0
    out = capsys.readouterr().out
    assert out.count("unchanged, skipped") == 3 and "3 unchanged" in out and "0 indexed" in out

    (folder / "sub" / "b.md").write_text("# Boats\n\nThe ferry Calloway Star now sails at eleven.\n")
    (folder / "c.txt").unlink()
    assert docs("add", "notes", str(folder)) == 0
    out = capsys.readouterr().out
    assert "b.md: indexed" in out and "a.txt: unchanged" in out
    assert f"removed {folder / 'c.txt'} (gone from the disk)" in out
    assert chunks_of(folder / "c.txt") == 0 and chunks_of(folder / "sub" / "b.md") == 1
    assert docs("search", "notes", "When does the ferry Calloway Star sail?", "-k", "1") == 0
    assert "eleven" in capsys.readouterr().out


def test_a_file_ember_cannot_read_fails_alone_with_its_reason(ember_home, tmp_path, capsys):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "good.txt").write_text("The clock tower of Ostermere chimes thirteen times at noon.")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj garbage")
    (folder / "blob.txt").write_bytes(b"binary\x00\x01\x02data")
    assert docs("add", "mixed", str(folder), str(tmp_path / "missing.txt")) == 1
    captured = capsys.readouterr()
    assert "broken.pdf: failed: broken.pdf is not a readable PDF" in captured.out
    assert "blob.txt: failed: blob.txt is not a text file" in captured.out
    assert "good.txt: indexed, 1 chunk" in captured.out and "1 indexed (1 chunk), 0 unchanged, 3 failed" in captured.out
    assert "missing.txt: no such file or folder" in captured.err
    assert docs("list", "mixed") == 0
    listing = capsys.readouterr().out
    assert listing.count("failed") == 2 and "not a readable PDF" in listing
    assert docs("search", "mixed", "Ostermere clock tower", "-k", "1") == 0
    assert capsys.readouterr().out.startswith("1. good.txt")


def test_rm_takes_out_files_then_the_whole_collection(ember_home, tmp_path, capsys):
    folder = tmp_path / "rm"
    folder.mkdir()
    for name, text in {"x.txt": "Xylophones of Brandt.", "y.txt": "Yodelling in Quarrow."}.items():
        (folder / name).write_text(text)
    assert docs("add", "rmme", str(folder)) == 0
    assert docs("rm", "rmme", str(folder / "x.txt")) == 0
    assert chunks_of(folder / "x.txt") == 0 and chunks_of(folder / "y.txt") == 1
    assert docs("rm", "rmme", str(folder / "nothing.txt")) == 1
    assert docs("rm", "rmme") == 0
    assert chunks_of(folder / "y.txt") == 0
    store = open_store(Settings.load())
    assert store.store_named("rmme") is None and store.file_by_path((folder / "y.txt").resolve()) is None
    store.close()
    capsys.readouterr()
    assert docs("search", "rmme", "anything") == 1


def test_without_an_embedding_model_it_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMBER_HOME", str(tmp_path / "empty-home"))
    (tmp_path / "a.txt").write_text("text")
    assert docs("add", "c", str(tmp_path / "a.txt")) == 2
    assert "ember models import FOLDER" in capsys.readouterr().err


def test_ctrl_c_stops_between_batches_and_leaves_the_index_consistent(home, ember_home, tmp_path):
    folder = tmp_path / "big"
    folder.mkdir()
    (folder / "a.txt").write_text("The lantern maker Odalys Finch lives in Harwick.")
    para = "Chapter {i}: the river {i} flows past the mill, and the miller counts {i} sacks of grain each day. "
    (folder / "b.txt").write_text("\n\n".join(para.format(i=i) * 9 for i in range(1500)))  # ~1500 chunks
    env = {**os.environ, "EMBER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "app", "docs", "add", "big", str(folder)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    assert "[1/2] a.txt: indexed" in first, first + proc.stderr.read()
    store, big = open_store(Settings.load()), str((folder / "b.txt").resolve())
    while not store.db.execute("SELECT 1 FROM store_files s JOIN files f ON f.id = s.file_id WHERE f.path=? "
                               "AND s.status='in_progress'", (big,)).fetchall():
        time.sleep(0.05)  # until b.txt is being indexed (the test's timeout bounds the wait)
    store.close()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "b.txt: cancelled" in out and "Stopped by Ctrl-C" in out and "stopping after this batch" in err
    assert chunks_of(folder / "a.txt") == 1 and chunks_of(folder / "b.txt") == 0
    (folder / "b.txt").write_text("A short file now: the miller retired.")
    assert docs("add", "big", str(folder)) == 0  # goes on where it stopped
    assert chunks_of(folder / "b.txt") == 1


def test_chat_with_docs_puts_each_turns_sources_in_the_prompt(kit, ember_home, tiny_model_factory, monkeypatch, capsys):
    import app.cli_chat as cli_chat

    prompts, real = [], cli_chat.build_engine

    def recording_engine(args):  # the real engine; what it is asked is kept
        engine = real(args)
        add = engine.add_request
        engine.add_request = lambda prompt, params, *a, **k: prompts.append(prompt) or add(prompt, params, *a, **k)
        return engine

    monkeypatch.setattr(cli_chat, "build_engine", recording_engine)
    q1, q2 = QUESTIONS[0], QUESTIONS[3]
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{q1.text}\n{q2.text}\n"))
    tiny = tiny_model_factory(ctx=4096)
    assert main(["chat", "--docs", "kit", "--model", str(tiny), "--backend", "torch", "--ctx", "4096", "-n", "3",
                 "--temperature", "0"]) == 0
    assert len(prompts) == 2
    assert INSTRUCTION in prompts[0] and f"[1] {q1.filename}" in prompts[0] and q1.fact in prompts[0]
    assert prompts[0].count("<sources>") == 1 and f"Question: {q1.text}" in prompts[0]
    # the second turn brings its own sources; the first question stays in the history as typed
    assert prompts[1].count("<sources>") == 1 and f"[1] {q2.filename}" in prompts[1] and q2.fact in prompts[1]
    assert prompts[1].index(q1.text) < prompts[1].index("<sources>")
    out = capsys.readouterr().out
    assert "sources it was given)" in out or "Sources:" in out


def test_the_cited_sources_print_with_file_and_location(capsys):
    hits = [Hit(1, "vs", "f1", "report.pdf", "page 2", "text", 0.9), Hit(2, "vs", "f2", "notes.md", "", "t", 0.5)]
    DocsChat(None, "vs", None).print_sources("Quenby kept it [2], see also [1] and [7].", hits)
    assert capsys.readouterr().out == "Sources:\n  [2] notes.md\n  [1] report.pdf, page 2\n"


def test_chat_docs_names_a_missing_collection(ember_home):
    with pytest.raises(SystemExit, match="no such collection"):
        main(["chat", "--docs", "nope"])
