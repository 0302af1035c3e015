"""The backend/device decision table on synthetic machines, and probe_machine on this one."""
from __future__ import annotations

import dataclasses
import re

import pytest

from engine.backends.device import probe_machine
from engine.model_files.fit import BackendDecision, BackendError, MachineInfo, choose_backend
from engine.model_files.footprint import GiB, MiB, ModelFootprint, estimate_bytes, max_context_that_fits

# SmolLM2-135M Q4_1: 30 layers, 3 KV heads of 64 → 23,040 bytes of f16 KV per token.
SMOL = ModelFootprint("gguf", 92 * MiB, 30, 3, 64, 8192)
# A 7B-class GGUF: 32 layers, 8 KV heads of 128 → 131,072 bytes of f16 KV per token.
BIG = ModelFootprint("gguf", int(4.1 * GiB), 32, 8, 128, 32768)
GPTQ = ModelFootprint("gptq", int(3.9 * GiB), 32, 8, 128, 32768)

CPU_24G = MachineInfo(ram_free_bytes=20 * GiB, ram_total_bytes=24 * GiB, cpu_count=2)


def cuda(free_gib: float, ram_gib: float = 20) -> MachineInfo:
    return MachineInfo(ram_free_bytes=int(ram_gib * GiB), ram_total_bytes=32 * GiB, cpu_count=8,
                       cuda_available=True, cuda_name="test GPU", cuda_free_bytes=int(free_gib * GiB),
                       cuda_total_bytes=int(free_gib * GiB) + GiB)


def test_kv_bytes_per_token_counts_only_kv_heads():
    assert SMOL.kv_bytes_per_token(2) == 2 * 30 * 3 * 64 * 2 == 23_040
    assert BIG.kv_bytes_per_token(2) == 131_072


def test_gguf_on_cpu_goes_to_llamacpp():
    d = choose_backend(CPU_24G, SMOL, context_length=4096)
    assert (d.backend, d.device, d.context_length) == ("llama.cpp", "cpu", 4096)
    assert d.est_bytes == 92 * MiB + 23_040 * 4096 + 512 * MiB
    assert "llama.cpp" in d.reason and "cpu" in d.reason
    assert isinstance(d.as_dict(), dict) and d.as_dict()["backend"] == "llama.cpp"


def test_gguf_on_cpu_goes_to_embers_kernels_where_they_cover_the_file():
    kernels = dataclasses.replace(CPU_24G, ember_kernels=True)
    d = choose_backend(kernels, dataclasses.replace(SMOL, kernels_cover=True), context_length=4096)
    assert (d.backend, d.device) == ("torch", "cpu") and "Ember's kernels" in d.reason
    # a type without a repack, or no kernels built: llama.cpp keeps the file
    assert choose_backend(kernels, SMOL, context_length=4096).backend == "llama.cpp"
    assert choose_backend(CPU_24G, dataclasses.replace(SMOL, kernels_cover=True)).backend == "llama.cpp"


def test_gguf_on_cuda_with_room_goes_to_torch_cuda():
    d = choose_backend(cuda(40), BIG, context_length=8192)
    assert (d.backend, d.device) == ("torch", "cuda")
    assert d.available_bytes == 40 * GiB


def test_cuda_too_small_falls_back_to_cpu_llamacpp():
    d = choose_backend(cuda(2), BIG, context_length=4096)
    assert (d.backend, d.device) == ("llama.cpp", "cpu")
    assert "cuda: needs" in d.reason  # the log says why the GPU was skipped


def test_gptq_goes_to_torch_on_every_device():
    assert (choose_backend(cuda(40), GPTQ, context_length=4096).backend,
            choose_backend(CPU_24G, GPTQ, context_length=4096).backend) == ("torch", "torch")
    assert choose_backend(cuda(40), GPTQ, context_length=4096).device == "cuda"
    with pytest.raises(BackendError, match="GGUF files only"):
        choose_backend(CPU_24G, GPTQ, backend="llama.cpp")


def test_mps_machine():
    mac = MachineInfo(ram_free_bytes=12 * GiB, ram_total_bytes=16 * GiB, cpu_count=8,
                      mps_available=True, mps_max_bytes=11 * GiB)
    d = choose_backend(mac, GPTQ, context_length=4096)
    assert (d.backend, d.device, d.available_bytes) == ("torch", "mps", 11 * GiB)
    # GGUF on a Mac whose llama.cpp has no Metal: torch on MPS (keeps the GPU).
    d = choose_backend(mac, SMOL, context_length=2048)
    assert (d.backend, d.device) == ("torch", "mps")
    # With a Metal build of llama.cpp, GGUF goes to llama.cpp on the GPU.
    metal = dataclasses.replace(mac, llama_cpp_gpu_offload=True)
    d = choose_backend(metal, SMOL, context_length=2048)
    assert (d.backend, d.device) == ("llama.cpp", "mps")


def test_explicit_requests_are_honoured_or_refused_clearly():
    assert choose_backend(CPU_24G, SMOL, backend="torch").backend == "torch"
    assert choose_backend(cuda(40), SMOL, device="cpu").device == "cpu"
    assert choose_backend(cuda(40), SMOL, backend="llama.cpp").device == "cpu"
    with pytest.raises(BackendError, match="'cuda' was requested but is not available"):
        choose_backend(CPU_24G, SMOL, device="cuda")
    with pytest.raises(BackendError, match="cannot run on cuda"):
        choose_backend(cuda(40), SMOL, backend="llama.cpp", device="cuda")
    with pytest.raises(BackendError, match="unknown backend"):
        choose_backend(CPU_24G, SMOL, backend="vulkan")
    no_llama = MachineInfo(ram_free_bytes=20 * GiB, ram_total_bytes=24 * GiB, cpu_count=2,
                           llama_cpp_available=False)
    assert choose_backend(no_llama, SMOL).backend == "torch"
    with pytest.raises(BackendError, match="not installed"):
        choose_backend(no_llama, SMOL, backend="llama.cpp")


def test_context_is_capped_at_the_models_own():
    assert choose_backend(CPU_24G, SMOL, context_length=100_000).context_length == 8192


def test_ram_too_small_names_a_context_that_fits():
    small = MachineInfo(ram_free_bytes=8 * GiB, ram_total_bytes=16 * GiB, cpu_count=4)
    with pytest.raises(BackendError) as e:
        choose_backend(small, BIG, context_length=32768)
    msg = str(e.value)
    m = re.search(r"--max-model-len (\d+)", msg)
    assert m, msg
    ctx = int(m.group(1))
    # The suggestion really fits, and is the longest (256-multiple) that does.
    assert estimate_bytes(BIG, "llama.cpp", ctx, "float32") <= 8 * GiB * 0.9
    assert estimate_bytes(BIG, "llama.cpp", ctx + 256, "float32") > 8 * GiB * 0.9
    assert ctx == max_context_that_fits(BIG, "llama.cpp", "float32", 8 * GiB)
    assert choose_backend(small, BIG, context_length=ctx).device == "cpu"
    assert "smaller quantization" in msg


def test_weights_alone_too_big_names_a_smaller_quant():
    tiny = MachineInfo(ram_free_bytes=3 * GiB, ram_total_bytes=4 * GiB, cpu_count=2)
    with pytest.raises(BackendError) as e:
        choose_backend(tiny, BIG, context_length=4096)
    msg = str(e.value)
    assert "--max-model-len" not in msg  # no context can help: the weights alone do not fit
    m = re.search(r"a model file of at most ([\d.]+) GiB", msg)
    assert m, msg
    budget = float(m.group(1)) * GiB
    assert budget < BIG.weights_bytes
    smaller = ModelFootprint("gguf", int(budget) - MiB, 32, 8, 128, 32768)
    assert choose_backend(tiny, smaller, context_length=512).device == "cpu"
    hopeless = MachineInfo(ram_free_bytes=256 * MiB, ram_total_bytes=4 * GiB, cpu_count=2)
    with pytest.raises(BackendError, match="much smaller model"):
        choose_backend(hopeless, BIG)


def test_probe_machine_reads_this_machine():
    import psutil
    import torch

    m = probe_machine()
    assert 0 < m.ram_free_bytes <= m.ram_total_bytes == psutil.virtual_memory().total
    assert m.cpu_count >= 1
    assert m.cuda_available == torch.cuda.is_available()
    if m.cuda_available:
        assert 0 < m.cuda_free_bytes <= m.cuda_total_bytes
    d = choose_backend(m, SMOL, context_length=2048)
    assert isinstance(d, BackendDecision) and d.est_bytes <= d.available_bytes


def test_footprint_of_the_bundled_model():
    from engine.backends.device import model_footprint
    from engine.model_files.bundled import default_model_path

    pytest.importorskip("engine.loaders.gguf_loader")
    path = default_model_path()
    fp = model_footprint(path)
    assert (fp.format, fp.num_layers, fp.num_kv_heads, fp.head_dim) == ("gguf", 30, 3, 64)
    assert fp.weights_bytes == path.stat().st_size
    assert fp.kernels_cover  # Q4_1 layers, a Q8_0 table: both repack
