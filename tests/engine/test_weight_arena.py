"""The weights moved into one huge-page mapping (engine/weight_arena.py): the same logits to the
bit, dense and on the C++ stack, every tensor inside the mapping, and shared storages (a tied
head) still shared. THP is forced to `madvise` here so the move runs on any kernel setting."""
from __future__ import annotations

import pytest
import torch

from engine import weight_arena
from engine.loaders.gguf_loader import load_model
from engine.model_files.bundled import default_model_path
from model_oracles import our_logits

TOKENS = [1, 504, 3458, 314, 260, 1823, 28, 2115, 42, 7, 99, 1000, 4096, 12]


@pytest.fixture
def thp_madvise(monkeypatch):
    monkeypatch.setattr(weight_arena, "thp_mode", lambda: "madvise")
    monkeypatch.delenv("EMBER_HUGE_PAGES", raising=False)


def _plain(model) -> list[torch.Tensor]:
    """Parameters and buffers with a storage (oneDNN's packed weights have none)."""
    return [t for t in (*model.parameters(), *model.buffers()) if not t.is_mkldnn and t.layout == torch.strided]


def _storages(model) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in _plain(model)}


def _inside(model) -> bool:
    mapping = torch.frombuffer(model._weight_arena, dtype=torch.uint8)
    lo, hi = mapping.data_ptr(), mapping.data_ptr() + mapping.numel()
    return all(lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi for t in _plain(model))


@pytest.mark.parametrize("quantized", [True, False], ids=["kernels", "dense"])
def test_moved_weights_give_the_same_logits(thp_madvise, monkeypatch, one_torch_thread, quantized):
    moved = load_model(default_model_path(), quantized=quantized)
    monkeypatch.setenv("EMBER_HUGE_PAGES", "0")
    plain = load_model(default_model_path(), quantized=quantized)
    assert not hasattr(plain, "_weight_arena") and _inside(moved)
    assert len(_storages(moved)) == 1 and len(_storages(plain)) > 1
    assert (moved.stack is not None) == quantized  # the stack was built over the moved tensors
    torch.testing.assert_close(our_logits(moved, TOKENS), our_logits(plain, TOKENS), rtol=0, atol=0)


def test_shared_storages_stay_shared(thp_madvise):
    """SmolLM2 ties its head to the table: after the move both still read the same bytes."""
    model = torch.nn.Module()
    table = torch.randn(512, 64)
    model.a = torch.nn.Linear(64, 512, bias=False)
    model.a.weight = torch.nn.Parameter(table, requires_grad=False)
    model.b = torch.nn.Module()
    model.b.register_buffer("rows", table[100:200])  # a view into the same storage
    moved = weight_arena.move_to_huge_pages(model, min_bytes=0)
    assert moved >= table.numel() * 4 and _inside(model)
    assert model.b.rows.untyped_storage().data_ptr() == model.a.weight.untyped_storage().data_ptr()
    assert torch.equal(model.b.rows, table[100:200]) and torch.equal(model.a.weight, table)
    model.a.weight.data[150, 0] = 7.0  # one set of bytes: a write shows through the view
    assert model.b.rows[50, 0].item() == 7.0


def test_off_when_the_kernel_will_not_give_huge_pages(monkeypatch):
    monkeypatch.setattr(weight_arena, "thp_mode", lambda: "never")
    model = torch.nn.Linear(1024, 1024)
    before = model.weight.data_ptr()
    assert weight_arena.move_to_huge_pages(model, min_bytes=0) == 0 and model.weight.data_ptr() == before
