"""The memory Settings and the model manager show is the engine's own arithmetic
(engine/model_files/memory.py): the KV pool a real runner sizes itself equals the estimate's, for
the torch runner and the llama.cpp runner, on the bundled model."""
from __future__ import annotations

import pytest

from app.fit import memory_line
from app.store import ModelStore
from engine.backends.device import model_footprint
from engine.config import EngineConfig
from engine.model_files.fit import MachineInfo
from engine.model_files.footprint import GiB, MiB
from engine.model_files.memory import describe, engine_memory, kv_pool_blocks
from ui_support import ui_settings  # noqa: F401


def test_the_pool_rule_binds_where_it_says():
    # 1 MiB blocks; 10 GiB free: a quarter is 2.5 GiB, capped at 1 GiB = 1024 blocks
    assert kv_pool_blocks(MiB, 10 * GiB, 4096, 64) == 1024
    assert kv_pool_blocks(MiB, 10 * GiB, 4096, 2) == 2 * 256  # two chats of 4096 tokens (256 blocks each)
    assert kv_pool_blocks(MiB, 100 * MiB, 4096, 64) == 256  # never below one full context


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_a_runner_sizes_its_pool_as_the_estimate_says(bundled_model_path, backend):
    fp = model_footprint(str(bundled_model_path))
    config = EngineConfig(model_path=str(bundled_model_path), dtype="float32", num_threads=2,
                          max_num_seqs=3, max_model_len=1024)
    if backend == "torch":
        from engine.model_runner import ModelRunner
        runner = ModelRunner(config)
    else:
        from engine.backends.llamacpp_runner import LlamaCppRunner
        runner = LlamaCppRunner(config)
    est = engine_memory(fp, backend, "float32", 1024, 3, free_bytes=16 * GiB)
    assert runner.kv_capacity_blocks() * config.block_size * est.kv_bytes_per_token == est.kv_max_bytes
    assert est.kv_max_bytes == 3 * 1024 * fp.kv_bytes_per_token(4 if backend == "torch" else 2)
    assert runner.kv_bytes == est.kv_max_bytes  # what the engine's status reports as reserved
    assert 0.5 * fp.weights_bytes < runner.weight_bytes < 10 * fp.weights_bytes and runner.num_threads == 2
    runner.close()


def test_the_settings_line_follows_chats_context_and_backend(qtbot, ui_settings):  # noqa: F811
    from ui.settings_dialog import SettingsDialog

    ModelStore(ui_settings.models_dir).ensure_default()
    dialog = SettingsDialog(ui_settings)
    qtbot.addWidget(dialog)
    row = dialog.memory  # no engine: "Loaded now" says so; the calculator is for the default model
    assert row.loaded.text().startswith("The engine has not answered yet")
    name = ModelStore(ui_settings.models_dir).get(ui_settings.default_model).name
    assert row.what_if.text().startswith("<b>What if…</b> a calculator, not a setting") and name in row.what_if.text()
    row.chats.setValue(2)
    row.context.setValue(2048)
    two = row.text.text()
    assert "with 2 chats of 2048 tokens" in two
    dialog.backend.setCurrentText("llama.cpp")
    assert row.text.text().startswith("llama.cpp on cpu")
    row.chats.setValue(8)
    assert "with 8 chats of 2048 tokens" in row.text.text()


def test_the_line_says_why_when_the_model_does_not_fit(bundled_model_path):
    meta = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "context_length": 8192}
    tiny = MachineInfo(ram_free_bytes=64 * MiB, ram_total_bytes=GiB, cpu_count=2)
    assert "does not fit" in memory_line(100 * MiB, meta, tiny, backend="torch")
    est = engine_memory(model_footprint(str(bundled_model_path)), "torch", "bfloat16", 4096, 4, 8 * GiB)
    assert describe(est, 4096, 4).startswith(f"up to {est.max_bytes / MiB:.0f} MiB with 4 chats of 4096 tokens")
