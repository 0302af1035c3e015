"""`ember bench restart` on a tiny model: the new turn after a restart reads the chat's blocks
from the disk tier and replies with the same tokens as without it."""
from __future__ import annotations

import pytest

from app.cli import main


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_bench_restart_reads_the_chat_from_disk(tiny_model_factory, capsys, backend):
    model = tiny_model_factory(arch="llama", n_heads=4, n_kv_heads=2)
    rc = main(["bench", "restart", "--model", str(model), "--tokens", "40", "--runs", "1", "--context", "256",
               "--reply", "4", "--threads", "1", "--dtype", "float32", "--backend", backend])
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert rc == 0 and row[0] == "40" and row[-2:] == ["32", "identical"]  # two full blocks of 16 from disk
