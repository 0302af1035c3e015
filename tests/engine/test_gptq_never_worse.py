"""GPTQ never worse than RTN on held-out rows (issue 69, engine/quant/rtn_guard.py): each output
row keeps GPTQ's codes only where its held-out error is at most RTN's; a calibration that misleads
GPTQ gives RTN's rows back; `ember quantize` prints the written checkpoint's held-out error."""
from __future__ import annotations

import inspect
import re
import textwrap

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from app.cli import main
from engine.quant.gptq import GPTQ
from engine.quant.rtn_guard import held_out, keep_better, row_errors, rtn_like
from test_quantizers import correlated


def gptq_of(x_fit: torch.Tensor, w: torch.Tensor, desc_act: bool = False):
    g = GPTQ(w.shape[1])
    g.add_batch(x_fit)
    return g.quantize(w, 4, 16, True, desc_act=desc_act, damp=0.01)


@pytest.mark.parametrize("desc_act", [False, True])
def test_a_misleading_calibration_keeps_rtn(desc_act):
    """Fit rows in a 4-dimensional subspace of 64 inputs: GPTQ pushes its error into the 60
    directions it never saw, which the held-out rows (all directions) do see."""
    K, N = 64, 32
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(1)) * 0.05
    x_fit = torch.randn(40, 4, generator=torch.Generator().manual_seed(2)) @ torch.randn(4, K)
    x_held = correlated(200, K, seed=3)
    gq = gptq_of(x_fit, w, desc_act)
    r = rtn_like(w, gq, sym=True)
    out, tally = keep_better(w, gq, x_held, sym=True)
    err = lambda q: row_errors(x_held, w.double() - q.dequantize().double())  # noqa: E731
    assert torch.all(err(out) <= torch.minimum(err(gq), err(r)))  # row by row the better one
    assert err(gq).sum() > err(r).sum()  # GPTQ lost here
    assert tally.rows_rtn > tally.rows_gptq and tally.rows_gptq + tally.rows_rtn == N
    assert tally.chosen <= tally.rtn
    assert torch.equal(out.q[err(gq) > err(r)], r.q[err(gq) > err(r)])
    assert out.g_idx is gq.g_idx


def test_a_good_calibration_keeps_gptq():
    K, N = 64, 32
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(4)) * 0.05
    gq = gptq_of(correlated(2000, K, seed=5), w)
    out, tally = keep_better(w, gq, correlated(500, K, seed=5, tokens=1), sym=True)
    assert tally.rows_gptq > 0.9 * N and tally.chosen < tally.rtn


def test_held_out_samples():
    assert [held_out(n) for n in (1, 2, 8, 16, 32)] == [0, 1, 1, 2, 4]


def test_quantize_prints_the_held_out_error_against_rtn(tiny_model_factory, tmp_path, capsys):
    gguf = tiny_model_factory(arch="qwen2", hidden=128, ffn=256, n_heads=4, n_kv_heads=2, qtype=QT.F32)
    cal = tmp_path / "calibration.txt"
    cal.write_text(inspect.getsource(textwrap)[:6000], encoding="utf-8")
    assert main(["quantize", str(gguf), str(tmp_path / "q"), "--method", "gptq", "--samples", "2",
                 "--seq-len", "64", "--group-size", "32", "--calibration", str(cal), "--no-progress"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    m = re.fullmatch(r"held-out output error ([\d.]+)% \(RTN's ([\d.]+)%\); rows from GPTQ (\d+), from RTN (\d+)",
                     line)
    assert m, line
    assert float(m[1]) <= float(m[2])
    assert int(m[3]) + int(m[4]) == 2 * (128 + 64 + 64 + 128 + 256 + 256 + 128)  # every row of both layers
