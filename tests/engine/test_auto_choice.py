"""`auto` means one thing in every command: one rule for backend, device and dtype, one set of
flags, and the same decision logged by `ember chat`, `ember generate` and `ember serve`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from engine.model_files.fit import DTYPES, MachineInfo, auto_dtype, choose_backend, cpu_has_fast_bf16
from engine.model_files.footprint import GiB, MiB, ModelFootprint

ROOT = Path(__file__).resolve().parents[2]
SMOL = ModelFootprint("gguf", 92 * MiB, 30, 3, 64, 8192)
GPTQ = ModelFootprint("gptq", int(3.9 * GiB), 32, 8, 128, 32768)


def machine(fast_bf16: bool, **kw) -> MachineInfo:
    return MachineInfo(ram_free_bytes=20 * GiB, ram_total_bytes=24 * GiB, cpu_count=2, cpu_fast_bf16=fast_bf16, **kw)


@pytest.mark.parametrize("fast_bf16, want", [(True, "bfloat16"), (False, "float32")])
def test_torch_on_a_cpu_takes_bf16_only_where_it_is_fast(fast_bf16, want):
    d = choose_backend(machine(fast_bf16), SMOL, backend="torch")
    assert (d.backend, d.device, d.dtype) == ("torch", "cpu", want)
    assert want in d.reason and "auto" in d.reason
    assert choose_backend(machine(fast_bf16), GPTQ).dtype == want  # GPTQ runs on torch: the same rule


def test_an_explicit_dtype_is_kept_and_llamacpp_keeps_its_quantization():
    assert choose_backend(machine(True), SMOL, backend="torch", dtype="float32").dtype == "float32"
    d = choose_backend(machine(True), SMOL)  # GGUF on a CPU: llama.cpp
    assert (d.backend, d.dtype) == ("llama.cpp", "float32") and "quantized" in d.reason
    assert "applies to the torch backend" in choose_backend(machine(True), SMOL, dtype="bfloat16").reason


def test_cuda_takes_bf16_and_the_kv_estimate_follows_the_dtype():
    gpu = machine(False, cuda_available=True, cuda_free_bytes=8 * GiB, cuda_total_bytes=9 * GiB)
    d = choose_backend(gpu, GPTQ, context_length=4096)
    assert (d.device, d.dtype) == ("cuda", "bfloat16")
    f32 = choose_backend(machine(False), SMOL, backend="torch", context_length=4096)
    bf16 = choose_backend(machine(True), SMOL, backend="torch", context_length=4096)
    assert f32.est_bytes - bf16.est_bytes == SMOL.kv_bytes_per_token(2) * 4096  # 4-byte vs 2-byte KV


def test_the_runner_built_directly_resolves_auto_by_the_same_rule():
    import torch

    from engine.model_runner import resolve_dtype

    want = auto_dtype("cpu", cpu_has_fast_bf16())
    assert resolve_dtype("auto", torch.device("cpu")) == getattr(torch, want)


@pytest.mark.parametrize("argv", [["chat"], ["generate", "hi"], ["serve"]])
def test_every_command_that_runs_a_model_defaults_to_auto(argv):
    from app.cli import build_parser
    from engine.serve import build_parser as engine_parser

    args = build_parser().parse_args(argv)
    assert (args.backend, args.device, args.dtype) == ("auto", "auto", "auto")
    e = engine_parser().parse_args(["serve"])  # the GUI's engine: python -m engine serve
    assert (e.backend, e.device, e.dtype) == ("auto", "auto", "auto")
    for bench in (["bench", "decode"], ["bench", "throughput"], ["bench", "turns"], ["bench", "server"]):
        b = build_parser().parse_args(bench)
        assert (b.device, b.dtype) == ("auto", "auto"), bench
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--dtype", "int3"])  # the same choices everywhere
    assert set(DTYPES) == {"auto", "float32", "bfloat16", "float16"}


def test_the_gui_settings_reach_the_engine_flags(tmp_path):
    from app.settings import Settings
    from app.supervisor import EngineSupervisor

    s = Settings(data_dir=tmp_path, dtype="float32", backend="torch")
    cmd = EngineSupervisor(s, model_path=tmp_path / "m.gguf")._command(port=0)
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--backend") + 1] == "torch"


DECISION = re.compile(r"backend: (\S+) on (\S+), (\S+) — ")


@pytest.mark.slow
def test_chat_generate_and_serve_log_the_same_decision(tmp_path, bundled_model_path):
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    ember = [sys.executable, "-m", "app.cli", "-v"]  # the decision is an INFO line: shown with -v
    found = {}
    gen = subprocess.run([*ember, "generate", "Hello", "-n", "2"], env=env, capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert gen.returncode == 0, gen.stderr
    found["generate"] = DECISION.search(gen.stderr).groups()
    chat = subprocess.run([*ember, "chat"], input="Hi\n\n", env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert chat.returncode == 0, chat.stderr
    found["chat"] = DECISION.search(chat.stderr).groups()
    ready = tmp_path / "ready.json"
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        serve = subprocess.Popen([*ember, "serve", "--port", "0", "--ready-file", str(ready)], env=env,
                                 stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        health: dict = {}
        while health.get("status") != "ready":
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
            if ready.exists():
                port = json.loads(ready.read_text())["port"]
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        found["serve"] = DECISION.search(log.read_text()).groups()
        decision = health["decision"]
        assert (decision["backend"], decision["device"], decision["dtype"]) == found["serve"]
    finally:
        serve.terminate()
        serve.wait(30)
    print(f"\n{found}")
    assert found["chat"] == found["generate"] == found["serve"]
