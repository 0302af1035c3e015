"""The resident models as /v1/engine/status lists them: each model's memory, requests and expiry,
the requests waiting for memory and the budget (the GUI's status bar and model manager read it)."""
from __future__ import annotations

from engine.server.reasoning import thinking_switches
from engine.service.handle import EngineStatus, ModelStatus
from engine.service.residency import rss_bytes, total_ram_bytes


def model_entry(m: ModelStatus) -> dict:
    s, loaded = m.stats, m.model
    return {"id": m.spec.id, "name": m.spec.name or m.spec.id, "state": m.state,
            "backend": loaded.backend if loaded else None, "device": loaded.device if loaded else None,
            "bytes": m.bytes, "weight_bytes": s.weight_bytes if s else None, "kv_bytes": s.kv_bytes if s else None,
            "running": m.running, "expires_at": m.expires_at,
            "context_length": s.max_model_len if s else None,
            "embeds_only": bool(loaded and not loaded.generates),
            "completion_only": bool(loaded and loaded.engine.chat_template.plain_layout),
            # what a chat on this model may switch (the window's panel follows the chat's own model)
            "thinking": thinking_switches(loaded.engine.chat_template) if loaded and loaded.generates else None,
            "speculative": bool(loaded and loaded.engine.speculator is not None)}


def residency_status(status: EngineStatus) -> dict:
    mem = status.memory
    return {"models": [model_entry(m) for m in status.models],
            "queue": [{"model": q.model, "position": q.position, "waiting_s": q.waiting_s, "requests": q.requests}
                      for q in status.queue],
            "memory": {"budget_bytes": mem.budget_bytes if mem else 0, "used_bytes": mem.used_bytes if mem else 0,
                       "rss_bytes": rss_bytes(), "max_models": mem.max_models if mem else 0,
                       "total_bytes": total_ram_bytes()}}
