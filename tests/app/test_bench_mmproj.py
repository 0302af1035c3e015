"""`--mmproj` on `ember bench`: a bench that loads an engine through the shared workload helper (or
starts a server) hands the projector to it; a bench that cannot load one (Ember's torch engine, or
the quantizer's text) refuses the flag in words. No bench takes the flag and ignores it."""
from __future__ import annotations

import pytest

from app.bench.lib.workloads import build_engine
from app.bench.server import engine_flags
from app.cli import build_parser
from vlm_factory import write_tiny_vlm


@pytest.mark.parametrize("bench", ["spec", "window", "quant"])
def test_a_bench_without_an_image_path_refuses_mmproj_in_words(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["bench", bench, "--mmproj", "proj.gguf"])
    assert stop.value.code == 2
    assert "--mmproj is not taken by" in capsys.readouterr().err


def test_the_workload_benches_load_their_engine_with_the_projector(tmp_path):
    vlm = write_tiny_vlm(tmp_path)
    for bench in ("throughput", "grammar", "turns"):
        args = build_parser().parse_args(["bench", bench, "--model", str(vlm.model), "--mmproj", str(vlm.mmproj)])
        assert args.mmproj == str(vlm.mmproj)
    args.concurrency, args.threads = [1], 1
    engine = build_engine(str(vlm.model), args, "llama.cpp")
    try:
        assert engine.runner.vision is not None  # the projector is loaded, not dropped
    finally:
        engine.close()
    server = build_parser().parse_args(["bench", "server", "--mmproj", str(vlm.mmproj)])
    flags = engine_flags(server, 16)
    assert flags[flags.index("--mmproj") + 1] == str(vlm.mmproj)  # the served engine gets it
