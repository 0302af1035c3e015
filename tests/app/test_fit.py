"""fit_advice: hand-computed cases (numbers derived in the comments), GPU vs CPU choice, probe.

The rule is the engine's (engine/model_files/fit.py): weights + KV at the context + 512 MiB
overhead within 90% of what is free; test_fit_agreement.py holds the badge to the engine's decision.
"""
from __future__ import annotations

import psutil
import pytest

from app.fit import FitAdvice, fit_advice, probe_host
from engine.model_files.footprint import GiB as GIB
from engine.model_files.footprint import MiB as MIB
from engine.model_files.fit import MachineInfo
from engine.model_files.footprint import kv_bytes_per_token

SMOL = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "context_length": 8192}  # SmolLM2-135M
QWEN7B = {"num_layers": 28, "num_kv_heads": 4, "head_dim": 128, "context_length": 32768}


def machine(ram_free: int, vram_free: int = 0) -> MachineInfo:
    return MachineInfo(ram_free_bytes=ram_free, ram_total_bytes=2 * ram_free, cpu_count=2,
                       cuda_available=vram_free > 0, cuda_name="test GPU" if vram_free else "",
                       cuda_free_bytes=vram_free, cuda_total_bytes=vram_free)


def test_kv_bytes_per_token():
    # K and V, 30 layers, 3 KV heads of 64 dims, 2 bytes each: 2·30·3·64·2
    assert kv_bytes_per_token(30, 3, 64) == 23040
    assert kv_bytes_per_token(28, 4, 128, itemsize=1) == 28672


def test_small_model_on_a_roomy_machine_gets_full_context_and_max_slots():
    # GGUF on a CPU: llama.cpp, f16 KV, 23,040 B/token. fixed = 100 MiB + 512 MiB = 641,728,512;
    # usable = 0.9·4 GiB = 3,865,470,566 → KV room 3,223,742,054 / 23,040 → 139,919 tokens > 8192;
    # /(23,040·4096) → 34 chats, capped at 16
    a = fit_advice(100 * MIB, SMOL, machine(4 * GIB))
    assert (a.fits, a.max_context, a.max_parallel, a.device) == (True, 8192, 16, "cpu")
    assert a.kv_bytes_per_token == 23040 and a.needed_bytes == 641_728_512 + 8192 * 23040


def test_tight_machine_gets_a_shorter_context_and_one_chat():
    # usable = 0.9·800 MiB = 754,974,720; KV room 113,246,208 / 23,040 = 4915 → 4864 (multiple of 256):
    # the default 4096 fits, the model's 8192 does not; 113,246,208 / (23,040·4096) = 1 chat
    a = fit_advice(100 * MIB, SMOL, machine(800 * MIB))
    assert (a.fits, a.max_context, a.max_parallel) == (True, 4864, 1)


def test_too_small_says_how_much_is_needed():
    # at the default 4096 tokens: 641,728,512 + 4096·23,040 = 736,100,352 B = 0.69 GiB; 256 MiB free
    a = fit_advice(100 * MIB, SMOL, machine(256 * MIB))
    assert not a.fits and a.max_context == 0 and a.max_parallel == 0
    assert "needs 0.69 GiB" in a.reason and "0.25 GiB free" in a.reason  # the engine's own refusal


def test_gpu_used_when_it_fits_else_cpu():
    # 8 GiB VRAM: GGUF on CUDA is torch in bf16, 57,344 B/token of KV; usable 7,730,941,132 − weights
    # 4,831,838,208 − 536,870,912 = 2,362,232,012 B of KV → 41,194 tokens ≥ 32,768;
    # 2,362,232,012 / (57,344·4096) = 10 chats of 4096
    gpu = fit_advice(int(4.5 * GIB), QWEN7B, machine(16 * GIB, 8 * GIB))
    assert (gpu.fits, gpu.device, gpu.max_context, gpu.max_parallel) == (True, "cuda", 32768, 10)
    # 4 GiB VRAM cannot hold the weights: CPU (llama.cpp, f16 KV) with 16 GiB free → 42 chats, capped at 16
    cpu = fit_advice(int(4.5 * GIB), QWEN7B, machine(16 * GIB, 4 * GIB))
    assert (cpu.fits, cpu.device, cpu.max_context, cpu.max_parallel) == (True, "cpu", 32768, 16)


def test_meta_from_objects_and_unknown_kv_shape():
    class Manifest:  # any object with the four attributes (ModelManifest, CatalogEntry, ModelConfig)
        num_layers, num_kv_heads, head_dim, context_length = 30, 3, 64, 8192

    m = machine(4 * GIB)
    assert fit_advice(100 * MIB, Manifest(), m) == fit_advice(100 * MIB, SMOL, m)
    u = fit_advice(100 * MIB, {"context_length": 2048}, m)
    assert u.fits and u.max_context == 2048 and "KV size unknown" in u.reason
    assert fit_advice(0, SMOL, m) == FitAdvice(False, 0, 0, "model size unknown")


def test_probe_host_reads_this_machine_without_torch():
    info = probe_host()
    assert info.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < info.ram_free_bytes <= info.ram_total_bytes
    assert (info.cuda_available, info.cuda_total_bytes, info.cuda_free_bytes) == (False, 0, 0)


@pytest.mark.slow  # imports torch (seconds on a busy 2-core machine)
def test_probe_machine_with_torch_sees_the_gpu_if_any():
    torch = pytest.importorskip("torch")
    from engine.backends.device import probe_machine

    full = probe_machine()
    assert full.cuda_free_bytes <= full.cuda_total_bytes
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        assert full.cuda_total_bytes == total and full.cuda_name == torch.cuda.get_device_name(0)
    else:
        assert (full.cuda_total_bytes, full.cuda_name) == (0, "")


def test_catalog_entries_without_a_known_size_use_an_estimate():
    from app.catalog import Catalog

    cat = Catalog.load()
    qwen7 = cat.get("qwen2.5-7b-instruct-q4_k_m")  # size not known here: 7e9 × 4.85 bits / 8
    assert qwen7.size_bytes is None and qwen7.estimated_size_bytes == int(7e9 * 4.85 / 8)
    small = fit_advice(None, qwen7, machine(2 * GIB))
    assert not small.fits and "estimated size" in small.reason
    big = fit_advice(None, qwen7, machine(16 * GIB))
    assert big.fits and big.max_context == 32768
    smol = cat.get("smollm2-135m-instruct-q4_1")  # known size wins over the estimate
    assert smol.estimated_size_bytes == smol.size_bytes == 98_362_432
