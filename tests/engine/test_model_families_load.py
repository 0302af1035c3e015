"""Every architecture llama.cpp runs loads in Ember (on the llama.cpp runner, chosen by `auto`),
its KV sizing and fit read from its own header; an architecture no runner knows is refused in one
line on every path (CLI exit 2, import, HTTP 400 at load), nothing is registered, and a failed
load leaves the model that was serving loaded and answering.

The models are tiny random GGUFs in each architecture's real layout (tests/arch_ggufs.py).
"""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from app.store import ModelStore
from arch_ggufs import ARCHS, UNKNOWN_ARCH, write_arch_gguf
from engine.backends import load_engine, model_footprint
from engine.config import EngineConfig
from engine.model_files.fit import MachineInfo, UnsupportedArchitecture, choose_backend
from engine.model_files.footprint import GiB, RUNTIME_OVERHEAD_BYTES, kv_bytes_per_token
from engine.model_files.families import NOT_YET
from engine.model_files.manifest import ModelManifest, write_manifest
from engine.model_files.meta import read_meta
from engine.sampling_params import SamplingParams
from server_util import start_engine

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MACHINE = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=2, ember_kernels=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("archs")
    out = {}
    for arch in (*ARCHS, UNKNOWN_ARCH):
        path = d / f"{arch}.gguf"
        facts = write_arch_gguf(path, arch, chat_template=None if arch == "gemma3" else CHATML)
        out[arch] = (path, facts)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_the_footprint_and_fit_come_from_the_header_of_every_architecture(files, arch):
    path, facts = files[arch]
    fp = model_footprint(path)
    assert (fp.architecture, fp.num_layers, fp.num_kv_heads, fp.head_dim, fp.context_length) == (
        arch, facts.num_layers, facts.num_kv_heads, facts.head_dim, facts.context_length)
    assert (fp.sliding_window, fp.sliding_layers) == (facts.sliding_window, len(facts.sliding_layers))
    decision = choose_backend(MACHINE, fp)
    assert decision.backend == "llama.cpp" and decision.device == "cpu"
    if arch in NOT_YET:  # llama.cpp runs it, and the reason says why Ember's engine does not
        assert f"Ember's own engine: {NOT_YET[arch]}" in decision.reason
    else:  # Ember's engine runs the family; these f32 files go to llama.cpp for their weights
        assert fp.ember_engine and "Ember's own engine:" not in decision.reason
    per_token = kv_bytes_per_token(facts.num_layers, facts.num_kv_heads, facts.head_dim, 2)  # f16 K and V
    assert decision.est_bytes == fp.weights_bytes + per_token * decision.context_length + RUNTIME_OVERHEAD_BYTES


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_llama_cpp_runs_answers_on_the_llama_cpp_runner(files, arch):
    path, _ = files[arch]
    engine, decision = load_engine(EngineConfig(model_path=str(path), num_threads=1, max_model_len=128))
    try:
        assert decision.backend == "llama.cpp"
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        (out,) = engine.generate(["hello there"], params)
        assert len(out.output_token_ids) == 6 and out.finish_reason == "length"
    finally:
        engine.close()


def test_an_architecture_no_runner_knows_is_refused_in_one_line(files, tmp_path):
    path, _ = files[UNKNOWN_ARCH]
    with pytest.raises(UnsupportedArchitecture, match=f"unsupported architecture '{UNKNOWN_ARCH}': Ember runs "):
        choose_backend(MACHINE, model_footprint(path))
    env = {**os.environ, "EMBER_HOME": str(tmp_path / "home")}
    for argv in (["generate", "--model", str(path), "--raw", "hi"], ["models", "import", str(path)]):
        r = subprocess.run([sys.executable, "-m", "app", *argv], capture_output=True, text=True, env=env, timeout=300)
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 2, r.stderr
        assert len(err) == 1 and f"unsupported architecture '{UNKNOWN_ARCH}'" in err[0]
        assert "Traceback" not in r.stderr
    assert not list((tmp_path / "home").rglob("manifest.json"))  # the CLI's import registered nothing
    store = ModelStore(tmp_path / "store")
    with pytest.raises(UnsupportedArchitecture):
        store.import_path(path, model_id="unknown")
    assert store.list() == [] and not list((tmp_path / "store").rglob("*.gguf"))


def test_a_failed_load_leaves_the_previous_model_serving(files, tmp_path):
    """An unknown architecture that reached the store (a manifest written by hand, as an older
    Ember could): loading it is a 400 in words, and the model that served before still answers."""
    models = tmp_path / "models"
    store = ModelStore(models)
    store.import_path(files["qwen3"][0], model_id="good", mode="link")
    bad, _ = files[UNKNOWN_ARCH]
    write_manifest(models, ModelManifest.from_meta("bad", bad.resolve(), read_meta(bad), sha256="0" * 64,
                                                   size_bytes=bad.stat().st_size, source="import"))
    proc = start_engine(files["qwen3"][0], tmp_path, "--models-dir", str(models), "--max-model-len", "128",
                        backend="auto")
    try:
        h = proc.headers
        r = httpx.post(proc.base_url + "/v1/engine/load", json={"model": "good"}, headers=h, timeout=120)
        assert r.status_code == 200, r.text
        r = httpx.post(proc.base_url + "/v1/engine/load", json={"model": "bad"}, headers=h, timeout=120)
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert f"unsupported architecture '{UNKNOWN_ARCH}'" in msg and "Traceback" not in msg
        health = proc.health()
        assert health["status"] == "ready" and health["model"] == "good"
        # refused before anything was unloaded (issue 62): the server's model and "good" serve on (issue 63)
        assert health["message"].endswith("are still loaded") and "good" in health["message"].rsplit(";", 1)[1]
        body = {"model": "good", "prompt": "hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        r = httpx.post(proc.base_url + "/v1/completions", json=body, headers=h, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    finally:
        proc.stop()
