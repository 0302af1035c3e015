"""The CUDA 4-bit path (engine/layers/int4_linear.py): tinygemm's (scale, zero) convention,
checked on the CPU twin of its kernel here; the layer and a whole model on a GPU where there
is one (tools/cuda_check.py runs these there, with its benchmarks). CI has no GPU."""
from __future__ import annotations

import pytest
import torch

from engine.layers.int4_linear import Int4Linear, inner_k_tiles, nibble_pairs, scales_and_zeros, supports
from engine.weights.quant_weight import QuantWeight

CUDA = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs an sm80+ CUDA GPU (tools/cuda_check.py runs these)")


def weight(N: int, K: int, G: int = 32, seed: int = 0, with_min: bool = True) -> QuantWeight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
    d = (torch.rand(N, K // G, generator=g) * 0.02 + 1e-3).bfloat16().float()
    m = (torch.randn(N, K // G, generator=g) * 0.05).bfloat16().float() if with_min else -8 * d
    return QuantWeight(4, G, q, d, m)


def dequantized(w: QuantWeight) -> torch.Tensor:
    """float64 W from tinygemm's own bf16 (scale, zero), before tinygemm rounds it to bf16."""
    sz = scales_and_zeros(w).double()
    scale = sz[..., 0].t().repeat_interleave(w.group, dim=1)
    zero = sz[..., 1].t().repeat_interleave(w.group, dim=1)
    return (w.q.double() - 8) * scale + zero


def reference(w: QuantWeight, x: torch.Tensor) -> torch.Tensor:
    """float64 x W^T (dequantized)."""
    return x.double() @ dequantized(w).t()


def close(y: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> bool:
    """bf16 output: an ulp of each value (2^-8 relative), plus float32 summation slack; with
    `scale` (|x| |W|^T), bf16 rounding of the weights too: 2^-7 of it."""
    slack = 1e-3 if scale is None else scale * 2**-7
    return bool(((y.double() - ref).abs() <= ref.abs() * 2**-8 + slack).all())


@pytest.mark.parametrize("G", [32, 64, 128])
def test_scales_and_zeros_give_d_q_plus_m_in_tinygemm(G):
    """torch's CPU int4 kernel dequantizes as the CUDA one: (q - 8) scale + zero."""
    w = weight(48, 256, G)
    x = torch.randn(5, 256).bfloat16()
    packed = torch._convert_weight_to_int4pack_for_cpu(w.q.to(torch.int32), inner_k_tiles(256))
    y = torch._weight_int4pack_mm_for_cpu(x, packed, G, scales_and_zeros(w))
    assert close(y, reference(w, x))
    exact = w.dequantize().double()
    assert close(y, x.double() @ exact.t(), x.double().abs() @ exact.abs().t())  # and that is d q + m
    wrong = torch.stack((w.d, w.m), dim=-1).transpose(0, 1).contiguous().bfloat16()  # zero = m: off by 8 d
    assert not close(torch._weight_int4pack_mm_for_cpu(x, packed, G, wrong), reference(w, x))


def test_nibble_pairs_and_formats():
    q = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert nibble_pairs(q).tolist() == [[0x12, 0xF0]]
    assert supports(weight(16, 64)) and not supports(QuantWeight(8, 32, q.to(torch.int8), torch.ones(1, 1), None))
    assert not supports(weight(459, 64))  # tinygemm's column tiles are 8 wide: a 459-token head stays dense
    assert [inner_k_tiles(k) for k in (128, 64, 32)] == [8, 4, 2]


@needs_cuda
@pytest.mark.parametrize("M", [1, 7, 32, 33, 300])  # tinygemm up to DENSE_ROWS (256), dense bf16 above
def test_int4_linear_on_cuda(M):
    w = weight(512, 1024, seed=M).to("cuda")
    lin = Int4Linear(w, torch.randn(512, device="cuda"))
    x = torch.randn(M, 1024, device="cuda")
    xb = x.bfloat16().cpu()
    ref = reference(w.to("cpu"), xb) + lin.bias.double().cpu()
    # tinygemm forms each weight (q - 8) scale + zero in bf16 arithmetic (and the dense path above
    # 32 rows holds W in bf16): a weight rounding of 2^-8 of |x| |W|^T on top of the output's
    scale = xb.double().abs() @ dequantized(w.to("cpu")).abs().t()
    assert close(lin(x).cpu(), ref, scale)
    assert torch.equal(lin.rows(torch.tensor([3, 0], device="cuda")).cpu(), lin.dense()[[3, 0]].float().cpu())


@needs_cuda
def test_quantized_model_on_cuda_agrees_with_the_cpu(tmp_path):
    from gguf import GGMLQuantizationType as QT
    from gguf_factory import write_tiny_model

    from engine.loaders.gguf_loader import load_model

    path = tmp_path / "tiny.gguf"
    write_tiny_model(path, hidden=256, qtype=QT.Q4_0, embd_qtype=QT.Q8_0)
    gpu = load_model(path, torch.bfloat16, "cuda", quantized=True)
    assert any(isinstance(m, Int4Linear) for m in gpu.modules())
    ids = [i % 50 for i in range(40)]
    ours = prefill_logits(gpu, ids)
    for other in (load_model(path, torch.bfloat16, "cuda"), load_model(path, torch.float32, "cpu")):
        theirs = prefill_logits(other, ids)
        kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True,
                                        reduction="batchmean")
        assert kl < 0.02, kl


@torch.inference_mode()
def prefill_logits(model, ids: list[int]) -> torch.Tensor:
    """float32 [T, V] on the CPU: one sequence prefilled in one chunk on the model's device."""
    from engine.layers.attention import AttentionMetadata

    dev, cfg, T = model.device, model.config, len(ids)
    nb = -(-T // 16)
    shape = (nb, 16, cfg.num_kv_heads, cfg.head_dim)
    caches = [(torch.zeros(shape, dtype=model.dtype, device=dev), torch.zeros(shape, dtype=model.dtype, device=dev))
              for _ in range(cfg.num_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(T, device=dev), query_start_loc=[0, T], seq_lens=[T],
                             block_tables=torch.arange(nb, device=dev)[None, :], num_decodes=0)
    hidden = model(torch.tensor(ids, device=dev), torch.arange(T, device=dev), caches, meta)
    return model.compute_logits(hidden).float().cpu()
