"""fit_advice: hand-computed cases (numbers derived in the comments), GPU vs CPU choice, probe."""
from __future__ import annotations

import psutil
import pytest

from app.fit import GIB, MIB, FitAdvice, MachineInfo, fit_advice, kv_bytes_per_token, probe_machine

SMOL = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "context_length": 8192}  # SmolLM2-135M
QWEN7B = {"num_layers": 28, "num_kv_heads": 4, "head_dim": 128, "context_length": 32768}


def test_kv_bytes_per_token():
    # K and V, 30 layers, 3 KV heads of 64 dims, 2 bytes each: 2·30·3·64·2
    assert kv_bytes_per_token(30, 3, 64) == 23040
    assert kv_bytes_per_token(28, 4, 128, bytes_per_elem=1) == 28672


def test_small_model_on_a_roomy_machine_gets_full_context_and_max_slots():
    # fixed = 100 MiB + 256 MiB + 5 MiB = 378,535,936; budget = 0.9·4 GiB = 3,865,470,566
    # KV budget 3,486,934,630 / 23,040 B → 151,342 tokens > 8192; /(23,040·4096) → 36 chats, capped at 16
    a = fit_advice(100 * MIB, SMOL, MachineInfo(8 * GIB, 4 * GIB))
    assert (a.fits, a.max_context, a.max_parallel, a.device) == (True, 8192, 16, "cpu")
    assert a.kv_bytes_per_token == 23040 and a.needed_bytes == 378_535_936 + 8192 * 23040


def test_tight_machine_gets_a_shorter_context_and_one_chat():
    # budget = 0.9·512 MiB = 483,183,820; KV budget 104,647,884 / 23,040 = 4542 → 4352 (multiple of 256)
    a = fit_advice(100 * MIB, SMOL, MachineInfo(1 * GIB, 512 * MIB))
    assert (a.fits, a.max_context, a.max_parallel) == (True, 4352, 1)


def test_too_small_says_how_much_is_needed():
    a = fit_advice(100 * MIB, SMOL, MachineInfo(1 * GIB, 256 * MIB))
    assert not a.fits and a.max_context == 0 and a.max_parallel == 0
    assert "needs 0.36 GiB" in a.reason and "0.22 GiB usable" in a.reason  # 0.9·256 MiB = 0.2249… GiB


def test_gpu_used_when_it_fits_else_cpu():
    # 8 GiB VRAM: budget 7,730,941,132 − fixed 5,341,865,574 = 2,389,075,558 B of KV at 57,344 B/token
    # → 41,662 tokens ≥ 32,768; 2,389,075,558 / (57,344·4096) = 10 chats of 4096
    gpu = fit_advice(int(4.5 * GIB), QWEN7B, MachineInfo(32 * GIB, 16 * GIB, 8 * GIB, 8 * GIB, "test GPU"))
    assert (gpu.fits, gpu.device, gpu.max_context, gpu.max_parallel) == (True, "cuda", 32768, 10)
    # 4 GiB VRAM cannot hold the weights: CPU with 16 GiB available → 43 chats, capped at 16
    cpu = fit_advice(int(4.5 * GIB), QWEN7B, MachineInfo(32 * GIB, 16 * GIB, 4 * GIB, 4 * GIB, "test GPU"))
    assert (cpu.fits, cpu.device, cpu.max_context, cpu.max_parallel) == (True, "cpu", 32768, 16)


def test_meta_from_objects_and_unknown_kv_shape():
    class Manifest:  # any object with the four attributes (ModelManifest, CatalogEntry, ModelConfig)
        num_layers, num_kv_heads, head_dim, context_length = 30, 3, 64, 8192

    m = MachineInfo(8 * GIB, 4 * GIB)
    assert fit_advice(100 * MIB, Manifest(), m) == fit_advice(100 * MIB, SMOL, m)
    u = fit_advice(100 * MIB, {"context_length": 2048}, m)
    assert u.fits and u.max_context == 2048 and "KV size unknown" in u.reason
    assert fit_advice(0, SMOL, m) == FitAdvice(False, 0, 0, "model size unknown")


def test_probe_machine_reads_this_machine():
    info = probe_machine(use_torch=False)
    assert info.ram_total == psutil.virtual_memory().total and 0 < info.ram_available <= info.ram_total
    assert (info.vram_total, info.vram_free) == (0, 0)


@pytest.mark.slow  # imports torch (seconds on a busy 2-core machine)
def test_probe_machine_with_torch_sees_the_gpu_if_any():
    torch = pytest.importorskip("torch")
    full = probe_machine()
    assert full.vram_free <= full.vram_total
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        assert full.vram_total == total and full.gpu_name == torch.cuda.get_device_name(0)
    else:
        assert (full.vram_total, full.gpu_name) == (0, None)


def test_catalog_entries_without_a_known_size_use_an_estimate():
    from app.catalog import Catalog

    cat = Catalog.load()
    qwen7 = cat.get("qwen2.5-7b-instruct-q4_k_m")  # size not known here: 7e9 × 4.85 bits / 8
    assert qwen7.size_bytes is None and qwen7.estimated_size_bytes == int(7e9 * 4.85 / 8)
    small = fit_advice(None, qwen7, MachineInfo(8 * GIB, 2 * GIB))
    assert not small.fits and "estimated size" in small.reason
    big = fit_advice(None, qwen7, MachineInfo(32 * GIB, 16 * GIB))
    assert big.fits and big.max_context == 32768
    smol = cat.get("smollm2-135m-instruct-q4_1")  # known size wins over the estimate
    assert smol.estimated_size_bytes == smol.size_bytes == 98_362_432
