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
