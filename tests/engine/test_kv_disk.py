"""The prefix cache's disk tier on a real tiny model: a new engine on the same folder (a restart)
reads the prefix back and gives bit-identical logits and tokens to a run that computed it; a
truncated, flipped or foreign block file is refused, deleted and recomputed."""
from __future__ import annotations

import logging
import os
import random

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine.block_manager import hash_block_tokens
from engine.block_pool import NO_HASH
from engine.config import EngineConfig
from engine.kv_disk.block_file import HEADER, file_name, read_block_file, write_block_file
from engine.llm_engine import LLMEngine
from engine.model_runner import ModelRunner
from engine.sampling_params import SamplingParams

B, MAX_TOKENS = 4, 6
PROMPT = [random.Random(1).randrange(3, 200) for _ in range(70)]  # 17 full blocks before the last token


class RecordingRunner(ModelRunner):
    """The real runner, keeping every logits row it computes."""

    def logits(self, out, hidden):
        rows = super().logits(out, hidden)
        self.rows.append(rows.clone())
        return rows


def _run(model, disk=None):
    """Greedy reply to PROMPT on a fresh engine: (tokens, logits rows, tokens from a cache, the engine)."""
    config = EngineConfig(model_path=str(model), num_threads=1, block_size=B, max_prefill_chunk=16,
                          kv_disk_dir=str(disk) if disk else None)
    runner = RecordingRunner(config)
    runner.rows = []
    engine = LLMEngine(config, runner=runner)
    out = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
    engine.close()  # the writer has written everything once this returns
    rows = [r for r in runner.rows if len(r)]
    return out.output_token_ids, torch.cat(rows), out.num_cached_tokens, engine


@pytest.fixture(scope="module")
def model(tiny_model_factory):
    return tiny_model_factory(arch="qwen2", hidden=128, n_heads=4, n_kv_heads=2, ffn=256, qtype=QT.Q8_0)


@pytest.fixture(scope="module")
def cold(model):
    tokens, logits, cached, _ = _run(model)
    assert cached == 0
    return tokens, logits


def _block_hash(i: int) -> int:
    h = NO_HASH
    for j in range(i + 1):
        h = hash_block_tokens(h, PROMPT[j * B:(j + 1) * B])
    return h


def test_restart_reads_the_prefix_from_disk_bit_identical(model, cold, tmp_path):
    tokens, logits, cached, first = _run(model, tmp_path)
    assert (tokens, cached) == (cold[0], 0)
    assert torch.equal(logits, cold[1])
    store = first.disk_tier.store
    assert store.num_written >= 17
    for name in os.listdir(store.folder):
        assert os.stat(store.folder / name).st_mode & 0o077 == 0, name  # the user's alone
    tokens, logits, cached, again = _run(model, tmp_path)  # a new engine: the RAM cache is empty
    assert again.disk_tier.store.num_read == 17 and cached == 17 * B
    assert tokens == cold[0]
    assert torch.equal(logits, cold[1]), "the logits after a disk hit differ from a computed prefix"


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)


def _flip(path):
    with open(path, "r+b") as f:
        f.seek(HEADER.size + 57)
        byte = f.read(1)
        f.seek(HEADER.size + 57)
        f.write(bytes([byte[0] ^ 0x10]))


def _foreign(path):
    payload = bytearray(os.path.getsize(path) - HEADER.size)  # right size, another model's salt
    write_block_file(path, b"another-model-16", int(path.name[:32], 16), payload)


@pytest.mark.parametrize("damage", [_truncate, _flip, _foreign], ids=["truncated", "flipped", "foreign"])
def test_a_bad_block_file_is_refused_deleted_and_recomputed(model, cold, tmp_path, damage, caplog):
    first = _run(model, tmp_path)[3]
    folder, salt = first.disk_tier.store.folder, first.disk_tier.store.salt
    path = folder / file_name(_block_hash(5))
    damage(path)
    with caplog.at_level(logging.WARNING, logger="engine.kv_disk"):
        tokens, logits, cached, again = _run(model, tmp_path)
    store = again.disk_tier.store
    assert (store.num_refused, store.num_read, cached) == (1, 5, 5 * B)  # blocks 0-4 served, the rest computed
    assert tokens == cold[0] and torch.equal(logits, cold[1])
    assert "deleted" in caplog.text
    read_block_file(path, salt, _block_hash(5))  # recomputed and written again, whole


def test_a_write_a_killed_engine_left_is_swept(model, tmp_path):
    first = _run(model, tmp_path)[3]
    leftover = first.disk_tier.store.folder / f".{file_name(_block_hash(3))}.999.tmp"
    leftover.write_bytes(b"half a block")
    _run(model, tmp_path)
    assert not leftover.exists()


def test_a_full_disk_never_stops_the_chat(model, cold, tmp_path, caplog):
    config = EngineConfig(model_path=str(model), num_threads=1, block_size=B, max_prefill_chunk=16,
                          kv_disk_dir=str(tmp_path))
    engine = LLMEngine(config)
    folder = engine.disk_tier.store.folder
    folder.rename(tmp_path.parent / f"{tmp_path.name}-gone")  # at once: the writer's start-up sweep may be looking
    folder.write_text("")  # every write fails from now on
    with caplog.at_level(logging.WARNING, logger="engine.kv_disk"):
        out = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))[0]
        engine.close()
    assert out.output_token_ids == cold[0]
    assert engine.disk_tier.store.num_written == 0 and "not written" in caplog.text
