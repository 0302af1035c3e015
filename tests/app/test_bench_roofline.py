"""The decode roofline's bytes per token: what a step reads of Ember's loaded model, each byte
once, the lookup-only token table left out, whether or not the weight arena holds every tensor
in one storage."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

from app.bench.lib.roofline import covered, gguf_bytes_per_token, model_bytes_per_token
from tests.gguf_factory import write_tiny_model


def test_covered_counts_overlaps_once():
    assert covered([]) == 0
    assert covered([(0, 10), (10, 20)]) == 20
    assert covered([(0, 10), (5, 15), (2, 3), (30, 31)]) == 16


@pytest.mark.parametrize("tied", [False, True])
def test_bytes_per_token_match_the_files_reads(tmp_path, tied):
    """Ember's 8-bit tiles hold the file's Q8_0 blocks at about the same bits, so a step reads
    about what llama.cpp reads of the file: the separate head and every layer, and of the token
    table only one row unless it is the head (in the tiny model the table is a third of the rest,
    so counting it would be far outside the margin)."""
    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = write_tiny_model(tmp_path / "m.gguf", qtype=QT.Q8_0, tied=tied)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1), "torch", "cpu")
    assert getattr(engine.runner, "quantized", False)
    ours, file = model_bytes_per_token(engine.runner.model), gguf_bytes_per_token(str(path))
    assert 0.9 * file <= ours <= 1.12 * file


def test_a_mixture_of_experts_reads_its_used_experts_share(tmp_path):
    """qwen3moe takes 2 of its 4 experts a token: of each stacked expert tensor a token reads
    half, in llama.cpp's file and in Ember's loaded tiles alike; everything else whole."""
    from arch_ggufs import write_arch_gguf
    from engine.loaders.gguf_loader import load_model
    from engine.model_files.gguf_file import GGUFFile

    path = tmp_path / "moe.gguf"
    write_arch_gguf(path, "qwen3moe", qtype=QT.Q8_0)
    with GGUFFile(path) as f:
        sizes = {t.name: t.nbytes for t in f.tensors.values()}
    experts = sum(n for name, n in sizes.items() if "_exps." in name)
    file = gguf_bytes_per_token(str(path))
    assert file == sum(sizes.values()) - sizes["token_embd.weight"] - experts // 2  # a separate head
    ours = model_bytes_per_token(load_model(path, quantized=True))
    assert 0.9 * file <= ours <= 1.12 * file


def test_kv_bytes_read_counts_each_layers_context_or_window():
    """Every layer reads K and V of each token it attends to: the whole context, or a sliding
    window's last tokens once the context is longer."""
    from dataclasses import replace

    from app.bench.lib.roofline import kv_bytes_read
    from engine.model_files.families import FAMILIES
    from engine.models.config import ModelConfig

    base = ModelConfig(family=FAMILIES["llama"], vocab_size=10, hidden_size=64, intermediate_size=128, num_layers=4,
                       num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4,
                       rope_scaling=None, context_length=512, tie_word_embeddings=False, attention_bias=False)
    row = 32  # bytes of one KV head's row (16 values of 2 bytes)
    assert kv_bytes_read(base, 20, row) == 4 * 20 * 2 * 2 * row
    swa = replace(base, layer_windows=(0, 8, 0, 8))
    assert kv_bytes_read(swa, 20, row) == (20 + 8 + 20 + 8) * 2 * 2 * row
    assert kv_bytes_read(swa, 5, row) == 4 * 5 * 2 * 2 * row  # windows not yet full


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16", "q8_0"])
def test_bench_decode_counts_the_pools_bytes_per_context_token(tmp_path, kv_cache_dtype):
    """bench decode's K and V per token: the pool's own bytes per token slot (every layer's K and
    V pools over their slots), times the decode's mean context; llama.cpp's at f16."""
    from app.bench.decode import decode_kv_bytes
    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = write_tiny_model(tmp_path / "m.gguf", qtype=QT.Q8_0, n_layers=3, hidden=128)  # head_dim 32 (q8_0 rows)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1, kv_cache_dtype=kv_cache_dtype),
                            "torch", "cpu")
    runner = engine.runner
    slots = runner.kv_caches[0][0].shape[0] * runner.kv_caches[0][0].shape[1]
    per_slot = sum(t.numel() * t.element_size() for kv in runner.kv_caches for t in kv) / slots
    got = decode_kv_bytes(runner, prompt_tokens=100, new_tokens=20)
    assert got["ember"] == int(110 * per_slot)
    c = runner.model.config
    assert got["llama.cpp"] == 110 * c.num_layers * 2 * c.num_kv_heads * c.head_dim * 2
