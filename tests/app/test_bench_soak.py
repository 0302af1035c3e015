"""`ember bench soak` end to end on a tiny model: real servers, the paired rounds against a fresh
one, and the exit code that judges errors, leaks and KV blocks (speeds and growth are printed,
never judged here: no test depends on how fast the machine is, and a dozen requests show no slope)."""
from __future__ import annotations

import json

import pytest

from app.bench.lib.stats import slope
from app.cli import main

pytestmark = pytest.mark.timeout(600)


def test_slope_is_least_squares():
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([0, 1, 2], [5, 5, 5]) == 0.0 and slope([1], [9]) == 0.0


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_soak_with_paired_rounds_against_a_fresh_server(tmp_path, tiny_model_factory, capsys, monkeypatch,
                                                        speculative):
    monkeypatch.setenv("EMBER_DEBUG_HEAP", "1")  # what the bench sets for its servers; undone after the test
    out = tmp_path / "soak.json"
    argv = ["bench", "soak", "--model", str(tiny_model_factory()), "--backend", "torch", "--rounds", "3",
            "--clients", "3", "--per-client", "2", "--max-tokens", "6", "--prompt-scale", "0.1", "--warmup", "1",
            "--ab-pairs", "2", "--threads", "1", "--json", str(out),
            "--max-growth-mb", "1e9"]  # a dozen requests say nothing of growth: the benchmark's runs do
    assert main(argv + (["--speculative", speculative] if speculative else [])) == 0
    res = json.loads(out.read_text())
    assert res["summary"]["requests"] == 3 * 3 * 2 and res["summary"]["errors"] == 0
    assert res["summary"]["kv_used_end"] == 0
    assert len(res["ab"]["pairs"]) == 2 and all(a > 0 and b > 0 for a, b in res["ab"]["pairs"])
    assert res["ab"]["ratio_min"] <= res["ab"]["ratio_median"] <= res["ab"]["ratio_max"]
    printed = capsys.readouterr().out
    assert f"speculative {speculative or 'off'}" in printed and "soaked / fresh server tok/s" in printed
