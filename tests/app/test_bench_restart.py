"""`ember bench restart` on a tiny model: the new turn after a restart reads the chat's blocks
from the disk tier and replies with the same tokens as without it; its memory round reads the
chat back in a fresh process from a tier of one chat and of three."""
from __future__ import annotations

import pytest

from app.cli import main


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_bench_restart_reads_the_chat_from_disk(tiny_model_factory, capsys, backend):
    model = tiny_model_factory(arch="llama", n_heads=4, n_kv_heads=2)
    memory = ["--memory-chats", "3"] if backend == "torch" else ["--memory-chats", "0"]
    rc = main(["bench", "restart", "--model", str(model), "--tokens", "40", "--runs", "1", "--context", "256",
               "--reply", "4", "--threads", "1", "--dtype", "float32", "--backend", backend, *memory])
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith(" " * 10 + "40")).split()
    assert rc == 0 and row[-2:] == ["32", "identical"]  # two full blocks of 16 from disk
    if backend == "torch":
        one, three = (line.split() for line in lines[-2:])
        assert (one[0], three[0]) == ("1", "3") and one[-1] == three[-1] == "32"  # chat 0 read back from either
        assert float(three[1]) > 2 * float(one[1]) and float(one[2]) > 0  # the tier holds three chats' blocks
