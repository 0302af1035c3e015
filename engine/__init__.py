"""Ember's inference engine, its own process (`python -m engine serve`): the torch-free core loop
here (LLMEngine, Scheduler, BlockManager, OutputProcessor, the Runner contract), the torch
ModelRunner and its KV pool, and one package per room (docs/ARCHITECTURE.md is the map)."""
