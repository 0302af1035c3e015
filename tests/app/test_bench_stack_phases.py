"""bench decode's split of a decode step by the native decoder stack's phase timers and the
runner's forward and head: every phase of a real (tiny, quantized) model's stack is timed, the
parts fit inside the step, and the timers stop when profiling ends. No figure is compared with a speed."""
from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

from app.bench.step_profile import STACK_PHASES, format_phases, phase_names, stack_phases, steady_decode, timed_phases
from engine.kernels import kernels
from tests.gguf_factory import write_tiny_model

pytestmark = pytest.mark.skipif(kernels() is None, reason="Ember's CPU kernels are not built")


def test_every_phase_is_timed_inside_the_step(tmp_path):
    from engine.backends import load_engine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    path = write_tiny_model(tmp_path / "m.gguf", qtype=QT.Q8_0, hidden=128, n_layers=3)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1), "torch", "cpu")
    stack = engine.runner.model.stack
    assert stack is not None
    prompt = engine.tokenizer.encode("one two three four five six seven")
    phases = stack_phases(engine, prompt, new_tokens=6)
    assert set(phases) == {"step", *phase_names(moe=False), "forward outside the stack", "head"}
    assert all(phases[name] > 0 for name in (*phase_names(moe=False), "head")), phases
    assert phases["forward outside the stack"] >= 0
    assert sum(v for k, v in phases.items() if k != "step") < phases["step"]
    text = format_phases(phases)
    assert "attention" in text and "head" in text and "sampling, scheduler and Python" in text
    assert engine.runner.phase_timer is None  # the bench's hook is unset again
    assert not engine.has_unfinished()
    assert stack.phases() == [0.0] * len(STACK_PHASES)  # profiling is off again: reset, and
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert stack.phases() == [0.0] * len(STACK_PHASES)  # further steps add nothing


def test_python_layers_have_no_stack_phases(tmp_path):
    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = write_tiny_model(tmp_path / "m.gguf", qtype=QT.F32)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1), "torch", "cpu")
    assert stack_phases(engine, [1, 2, 3], new_tokens=2) is None


def test_a_mixture_of_experts_is_timed_as_one_phase(tmp_path):
    """qwen3moe's FFN is one call of the stack (engine/kernels/csrc/moe.cpp): its phase replaces
    the dense gate_up and down."""
    from arch_ggufs import write_arch_gguf
    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = tmp_path / "moe.gguf"
    write_arch_gguf(path, "qwen3moe", seed=1, qtype=QT.Q8_0)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1, max_model_len=128), "torch", "cpu")
    phases = stack_phases(engine, [1, 2, 3, 4], new_tokens=4)
    assert set(phases) == {"step", *phase_names(moe=True), "forward outside the stack", "head"}
    assert phases[STACK_PHASES[-1]] > 0 and "gate_up and act" not in phases


def test_a_batched_decode_is_timed_by_the_same_phases(tmp_path):
    """bench throughput's profile: several chats decoding together, a fixed number of steps timed
    (their requests go on: the bench aborts them)."""
    from arch_ggufs import write_arch_gguf
    from engine.backends import load_engine
    from engine.config import EngineConfig

    path = tmp_path / "moe.gguf"
    write_arch_gguf(path, "qwen3moe", seed=1, qtype=QT.Q8_0)
    engine, _ = load_engine(EngineConfig(model_path=str(path), num_threads=1, max_model_len=128), "torch", "cpu")
    ids = steady_decode(engine, [[1, 2, 3], [4, 5, 6, 7], [8, 9]], max_tokens=20, warm_steps=1)
    phases = timed_phases(engine, steps=3)
    assert set(phases) == {"step", *phase_names(moe=True), "forward outside the stack", "head"}
    assert phases[STACK_PHASES[-1]] > 0 and sum(v for k, v in phases.items() if k != "step") < phases["step"]
    assert engine.runner.phase_timer is None and engine.has_unfinished()
    for i in ids:
        engine.abort(i)
