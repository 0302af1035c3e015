"""Backends: choose (backend, device) for a model on this machine, then build the runner for it.

    decision = decide(config, backend="auto", device="auto")   # logs the choice; BackendError if no fit
    config = config_for(config, decision)                       # device, dtype, context
    engine = LLMEngine(config, runner=create_runner(config, decision))

or all three at once, `engine, decision = load_engine(config, backend, device)`: every command
that runs a model goes through here, so `auto` means one thing everywhere.
"""
from __future__ import annotations

import dataclasses
import logging

from engine.backends.device import model_footprint, probe_machine
from engine.config import EngineConfig
from engine.model_files.fit import BackendDecision, BackendError, MachineInfo, choose_backend
from engine.model_files.footprint import ModelFootprint, default_context
from engine.runner import Runner

log = logging.getLogger(__name__)

__all__ = ["BackendDecision", "BackendError", "MachineInfo", "ModelFootprint", "choose_backend",
           "config_for", "create_runner", "decide", "load_engine", "model_footprint", "probe_machine"]


def decide(config: EngineConfig, backend: str = "auto", device: str = "auto",
           machine: MachineInfo | None = None) -> BackendDecision:
    """Probe the machine (unless given) and the model file, choose, and log the decision."""
    fp = model_footprint(config.model_path)
    ctx = default_context(fp.context_length, config.max_model_len)
    if config.mmproj:
        backend = _vision_backend(config.mmproj, config.model_path, backend)
    decision = choose_backend(machine or probe_machine(), fp, backend=backend, device=device,
                              context_length=ctx, dtype=config.dtype)
    if decision.backend == "torch" and decision.device == "cpu":
        from engine.kernels import default_path
        try:  # EMBER_CPU_PATH naming a path this CPU cannot run: refused here, in words
            default_path()
        except ValueError as e:
            raise BackendError(str(e)) from None
    log.info("backend: %s on %s, %s — %s", decision.backend, decision.device, decision.dtype, decision.reason)
    return decision


def _vision_backend(mmproj: str, model: str, backend: str) -> str:
    """A projector runs through llama.cpp's libmtmd only: auto means llama.cpp, torch is refused."""
    from engine.model_files.errors import ModelFileError
    from engine.model_files.projector import check_projector

    try:
        check_projector(mmproj, model)
    except ModelFileError as e:
        raise BackendError(str(e)) from None
    if backend == "torch":
        raise BackendError("images (--mmproj) run on the llama.cpp backend only: use --backend llama.cpp or auto")
    return "llama.cpp"


def config_for(config: EngineConfig, decision: BackendDecision) -> EngineConfig:
    """The EngineConfig the decision implies: its device, dtype and context (llama.cpp's logits
    come back on the CPU, so the engine's side of it runs there)."""
    changes: dict = {"max_model_len": decision.context_length, "dtype": decision.dtype}
    if decision.backend == "llama.cpp":
        changes["device"] = "cpu"
    else:
        changes["device"] = decision.device
    return dataclasses.replace(config, **changes)


def create_runner(config: EngineConfig, decision: BackendDecision) -> Runner:
    """Build the runner for `decision`: a LlamaCppRunner or the torch ModelRunner (an
    EmbeddingRunner for an embedding model, which makes no text)."""
    from engine.model_files.architectures import embeds_only
    from engine.model_files.meta import read_meta

    if decision.backend == "llama.cpp" and embeds_only(read_meta(config.model_path).architecture):
        from engine.backends.embedding_runner import EmbeddingRunner
        return EmbeddingRunner(config)
    if decision.backend == "llama.cpp":
        from engine.backends.llamacpp_runner import LlamaCppRunner
        # On a GPU (a CUDA/Metal build of llama.cpp) offload every layer; on the CPU none.
        # Flash attention as llama.cpp's server does by default (-fa auto): with one unified KV
        # buffer the plain path multiplies every query by every sequence's cells, FA skips the
        # masked ones (16 chats on 2 cores: 149 -> 130 ms a step).
        return LlamaCppRunner(config, n_gpu_layers=0 if decision.device == "cpu" else -1, flash_attn=True)
    if decision.backend == "torch":
        from engine.model_runner import ModelRunner
        return ModelRunner(config)
    raise BackendError(f"unknown backend {decision.backend!r}")


def load_engine(config: EngineConfig, backend: str = "auto", device: str = "auto",
                machine: MachineInfo | None = None):
    """decide → config_for → create_runner → LLMEngine; returns (engine, decision)."""
    from engine.llm_engine import LLMEngine

    decision = decide(config, backend=backend, device=device, machine=machine)
    config = config_for(config, decision)
    return LLMEngine(config, runner=create_runner(config, decision)), decision
