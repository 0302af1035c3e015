"""`ember quantize SRC OUT` (app/cli_quantize.py) as a user runs it: what it writes, what it
refuses, and Ctrl-C. The written directory is checked by loading it with the engine and by its
config against the flags; refusals must leave nothing behind (no OUT, no hidden partial folder)."""
from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from app.cli import main
from engine.loaders.load import load_model
from engine.loaders.tokenizer import load_tokenizer

MODEL = dict(arch="llama", hidden=128, ffn=256, n_heads=4, n_kv_heads=2)
TEXT = "Hello, world! The quick brown fox 🙂 def main():\n    return 0  <|im_start|>user"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def src(tiny_model_factory) -> Path:
    return tiny_model_factory(**MODEL)


@pytest.fixture
def calibration(tmp_path) -> Path:
    path = tmp_path / "calibration.txt"
    path.write_text(inspect.getsource(textwrap)[:6000], encoding="utf-8")
    return path


def leftovers(out: Path) -> list[str]:
    """The hidden partial folders the writer may leave next to OUT."""
    return sorted(p.name for p in out.parent.glob(f".{out.name}.partial-*"))


def check_loads_like_the_gguf(out: Path, src: Path) -> None:
    model = load_model(out, torch.float32, "cpu")
    assert model.config.num_layers == 2 and model.config.hidden_size == 128
    ours, theirs = load_tokenizer(out), load_tokenizer(src)
    try:
        for special in (True, False):
            assert ours.encode(TEXT, parse_special=special) == theirs.encode(TEXT, parse_special=special)
    finally:
        ours.close()
        theirs.close()


@pytest.mark.parametrize("flags,want", [
    (["--method", "rtn", "--bits", "8", "--group-size", "64", "--asym", "--format", "gptq_v2"],
     {"quant_method": "gptq", "checkpoint_format": "gptq_v2", "bits": 8, "group_size": 64, "sym": False,
      "desc_act": False}),
    (["--method", "gptq", "--group-size", "32", "--desc-act"],
     {"quant_method": "gptq", "checkpoint_format": "gptq", "bits": 4, "group_size": 32, "sym": True,
      "desc_act": True}),
    (["--method", "awq", "--group-size", "-1"],
     {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": -1, "zero_point": True}),
    (["--method", "awq", "--group-size", "32", "--awq-clip"],
     {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 32, "zero_point": True}),
], ids=["rtn-gptq_v2-w8g64", "gptq-act-order", "awq-per-channel", "awq-clip-g32"])
def test_quantize_writes_a_checkpoint_the_engine_loads(src, tmp_path, calibration, capsys, flags, want):
    out = tmp_path / "out"
    rc = main(["quantize", str(src), str(out), *flags, "--samples", "2", "--seq-len", "32",
               "--calibration", str(calibration), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    assert {k: q.get(k) for k in want} == want
    assert not leftovers(out)
    assert str(out) in capsys.readouterr().out  # the summary line names the result
    check_loads_like_the_gguf(out, src)


def test_compressed_tensors_format(src, tmp_path):
    out = tmp_path / "ct"
    assert main(["quantize", str(src), str(out), "--method", "rtn", "--format", "compressed-tensors",
                 "--group-size", "128", "--no-progress"]) == 0
    q = json.loads((out / "config.json").read_text())["quantization_config"]
    w = q["config_groups"]["group_0"]["weights"]
    assert (q["quant_method"], q["format"], w["num_bits"], w["group_size"], w["symmetric"]) == \
        ("compressed-tensors", "pack-quantized", 4, 128, True)
    assert "lm_head" in q["ignore"]
    check_loads_like_the_gguf(out, src)


def refused(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and stderr of a refused command (argparse's own refusals exit with SystemExit)."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (["--bits", "3"], "invalid choice: 3"),
    (["--group-size", "16"], "invalid choice: 16"),
    (["--format", "awq", "--sym"], "AWQ GEMM format holds 4-bit, asymmetric"),
    (["--method", "awq", "--desc-act"], "without act-order"),  # its default format is AWQ GEMM
    (["--method", "awq", "--desc-act", "--format", "gptq"], "--desc-act is GPTQ's act-order"),
    (["--calibration", "/nonexistent/calibration.txt"], "no such file"),
    (["--method", "gptq", "--awq-clip"], "--awq-clip is AWQ's clip search"),
], ids=["bits-3", "group-16", "awq-sym", "awq-desc-act", "awq-desc-act-gptq-format",
                               "calibration-missing", "clip-without-awq"])
def test_bad_arguments_are_refused_and_leave_nothing(src, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    rc, err = refused(["quantize", str(src), str(out), "--no-progress", *extra], capsys)
    assert rc != 0 and message in err, err
    assert not out.exists() and not leftovers(out)


def test_existing_output_is_left_alone(src, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    rc, err = refused(["quantize", str(src), str(out), "--method", "rtn", "--no-progress"], capsys)
    assert rc != 0 and f"{out} exists" in err, err
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "keep me"
    assert not leftovers(out)


def test_missing_source(tmp_path, capsys):
    out, missing = tmp_path / "out", tmp_path / "nope.gguf"
    rc, err = refused(["quantize", str(missing), str(out), "--no-progress"], capsys)
    assert rc != 0 and str(missing) in err and "no such file" in err, err
    assert not out.exists() and not leftovers(out)


def test_a_quantized_directory_is_not_a_source(src, tmp_path, capsys):
    first = tmp_path / "gptq"
    assert main(["quantize", str(src), str(first), "--method", "rtn", "--no-progress"]) == 0
    out = tmp_path / "again"
    rc, err = refused(["quantize", str(first), str(out), "--method", "rtn", "--no-progress"], capsys)
    assert rc != 0 and str(first) in err and "already quantized" in err, err
    assert not out.exists() and not leftovers(out)


@pytest.mark.slow
def popen_taking_ctrl_c(args, **kwargs) -> subprocess.Popen:
    """A child that gets SIGINT as a terminal's foreground process does. Where this process was
    started with SIGINT ignored (a background job of a non-interactive shell), exec would pass
    SIG_IGN on and Python would never raise KeyboardInterrupt; a handler is reset to SIG_DFL."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_ctrl_c_stops_cleanly_and_writes_nothing(tiny_model_factory, tmp_path):
    """SIGINT once the progress bar is past the first layer: exit 130, a clear message, no OUT,
    no partial folder. 24 layers of GPTQ take long enough that the signal lands mid-run."""
    src = tiny_model_factory(arch="llama", hidden=256, ffn=512, n_heads=4, n_kv_heads=2, n_layers=24)
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = popen_taking_ctrl_c([sys.executable, "-m", "app.cli", "quantize", str(src), str(out), "--method", "gptq",
                                "--samples", "8", "--seq-len", "128", "--threads", "1"],
                               cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = bytearray()
    past_first = threading.Event()

    def read() -> None:  # tqdm redraws with \r, so read bytes, not lines
        while chunk := proc.stderr.read1(4096):
            err.extend(chunk)
            if b"layer 2/24" in err:
                past_first.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not past_first.is_set() and proc.poll() is None and time.monotonic() < deadline:
            past_first.wait(0.1)
        assert past_first.is_set(), f"no progress past layer 1 (rc {proc.poll()}): {err.decode(errors='replace')}"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    text = err.decode(errors="replace")
    assert rc == 130, text
    assert "stopped (Ctrl-C)" in text and f"nothing was written to {out}" in text, text
    assert "Traceback" not in text, text
    assert not out.exists() and not leftovers(out)
