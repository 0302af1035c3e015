"""The kernels' routing of a mixture of experts (engine/kernels/csrc/moe.cpp's moe_route, which the
native stack and engine/layers/moe.py both use): the top k of a softmax over the router's float32
logits, renormalised on request, against torch's float64 forward; a row's result whatever the
batch around it; ties to the lower expert, as a stable sort of the scores would give."""
from __future__ import annotations

import pytest
import torch

from engine.kernels import kernels

pytestmark = pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")


def _reference(x: torch.Tensor, router: torch.Tensor, k: int, norm: bool):
    probs = (x.double() @ router.double().T).softmax(-1)
    weights, experts = probs.topk(k, dim=-1)
    return (weights / weights.sum(-1, keepdim=True) if norm else weights), experts


@pytest.mark.parametrize("norm", [True, False], ids=["renormalised", "softmax-weights"])
@pytest.mark.parametrize("D,E,k", [(64, 4, 2), (1024, 32, 4), (2048, 128, 8), (96, 8, 8)])
def test_routing_matches_a_float64_softmax_and_top_k(D, E, k, norm):
    g = torch.Generator().manual_seed(D + E + k)
    x, router = torch.randn(37, D, generator=g), torch.randn(E, D, generator=g) / D ** 0.5
    weights, experts = kernels().moe_route(x, router, k, norm)
    ref_w, ref_e = _reference(x, router, k, norm)
    assert weights.dtype == torch.float32 and experts.dtype == torch.int64 and experts.shape == (37, k)
    assert torch.equal(experts, ref_e)  # these seeds hold no near-tie among the top k + 1
    torch.testing.assert_close(weights.double(), ref_w, rtol=1e-5, atol=1e-7)


def test_a_row_routes_the_same_alone_and_in_any_batch():
    g = torch.Generator().manual_seed(1)
    x, router = torch.randn(50, 512, generator=g), torch.randn(16, 512, generator=g)
    w, e = kernels().moe_route(x, router, 4, True)
    for i in (0, 17, 49):
        wi, ei = kernels().moe_route(x[i:i + 1], router, 4, True)
        assert torch.equal(wi[0], w[i]) and torch.equal(ei[0], e[i])


def test_tied_scores_go_to_the_lower_expert_and_k_must_fit():
    router = torch.zeros(6, 32)
    router[4] = router[1] = 1.0  # experts 1 and 4 tie above the rest; 0, 2, 3, 5 tie below
    w, e = kernels().moe_route(torch.ones(1, 32), router, 3, True)
    assert e.tolist() == [[1, 4, 0]] and abs(w.sum().item() - 1) < 1e-6
    with pytest.raises(RuntimeError, match="top 7 of 6"):
        kernels().moe_route(torch.ones(1, 32), router, 7, True)
