"""The main window's status bar: engine state, the loaded models (which one this chat uses), backend/device,
the replies' speed, drafts accepted, the last reply's prompt tokens from the cache, KV, the models' memory of
their budget, RAM."""
from __future__ import annotations

from collections.abc import Callable, Iterable

import psutil
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar, QWidget

from app.supervisor import SupervisorState
from ui.elided_label import ElidedLabel
from ui.engine_controller import REMOTE, EngineController
from ui.resident_models import memory_line, models_line, models_tooltip, resident, running
from ui.resources import engine_state_icon
from ui.sparkline import Sparkline

STATE_TEXT = {SupervisorState.STOPPED: "Engine stopped", SupervisorState.STARTING: "Loading model…",
              SupervisorState.READY: "Ready", SupervisorState.CRASHED: "Engine crashed, restarting…",
              SupervisorState.ERROR: "Engine error", REMOTE: "Remote server",
              "unreachable": "Server unreachable"}  # the polled status when the server did not answer


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


class EngineStatusBar(QStatusBar):
    """Fed by EngineController signals (state, polled status); `chats()` gives the open chats' (title, model)."""

    def __init__(self, engine: EngineController, parent: QWidget | None = None,
                 chats: Callable[[], Iterable[tuple[str, str | None]]] | None = None) -> None:
        super().__init__(parent)
        self.engine = engine
        self._chats = chats or (lambda: [])
        self.state_icon = QLabel(self)
        self.state_label = QLabel(self)  # short texts: these never shorten
        self.loading = QProgressBar(self, maximumWidth=90, maximumHeight=14, textVisible=False)
        self.loading.setRange(0, 0)  # busy: the engine does not report a fraction while loading
        self.model_label = ElidedLabel(parent=self)
        self.device_label = QLabel(self)
        self.spec_label = QLabel(self)  # speculative decoding's acceptance, when the engine drafts
        self.cached_label = QLabel(self)  # the last reply's prompt tokens that came from the prefix cache
        self.kv_label = ElidedLabel(parent=self)
        self.memory_label = QLabel(self)  # the loaded models' memory of their budget (Ember's engine)
        self.ram_label = QLabel(self)
        self.chart = Sparkline(parent=self)
        for w in (self.state_icon, self.state_label, self.loading, self.device_label):
            self.addWidget(w)
        # the model's name takes the room the figures leave, and is the one shortened first (its tooltip has it)
        self.model_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.addWidget(self.model_label, 1)
        for w in (self.spec_label, self.cached_label, self.kv_label, self.memory_label, self.ram_label, self.chart):
            self.addPermanentWidget(w)
        self.kv_label.setToolTip("Memory for conversations (the KV cache) in use")
        self.ram_label.setToolTip("Memory in use on this computer, all programs together")
        engine.state_changed.connect(self._on_state_changed)
        engine.status_changed.connect(self._on_status_changed)
        engine.models_changed.connect(lambda _ids: self.show_models())
        self._on_state_changed(engine.state)
        self._update_ram()

    def _on_state_changed(self, state: str) -> None:
        self.state_icon.setPixmap(engine_state_icon(state).pixmap(QSize(16, 16)))
        self.state_label.setText(STATE_TEXT.get(state, state))
        self.loading.setVisible(state == SupervisorState.STARTING)
        if state in (SupervisorState.STOPPED, SupervisorState.ERROR, SupervisorState.CRASHED):
            self.clear_engine_figures()  # a stopped engine has no model and no speed

    def clear_engine_figures(self) -> None:
        for label in (self.model_label, self.device_label, self.spec_label, self.cached_label, self.kv_label,
                      self.memory_label):
            label.setText("")
        self.chart.clear()

    def _on_status_changed(self, status: dict) -> None:
        state = status.get("status")
        if state == "unreachable" or (state and self.engine.state == REMOTE):
            self.state_label.setText(STATE_TEXT.get(state, state) if state != "ready" else "Remote server")
        elif state == "loading":
            self.state_label.setText(status.get("message") or STATE_TEXT[SupervisorState.STARTING])
            self.loading.setVisible(True)
        elif state == "ready" and self.engine.state == SupervisorState.READY:
            self.loading.setVisible(False)
            self.state_label.setText(busy_text(status) or STATE_TEXT[SupervisorState.READY])
            self.state_label.setToolTip(status.get("message") or "")  # e.g. which load failed before it
        elif state == "error" and self.engine.state == SupervisorState.READY:  # running, but its model failed
            self.loading.setVisible(False)
            self.state_label.setText("No model loaded")
            self.state_label.setToolTip(status.get("message") or "")
        self.show_models(status)
        parts = [p for p in (status.get("backend"), status.get("device")) if p]
        self.device_label.setText(" · ".join(parts))
        kv = status.get("kv") or {}
        if kv.get("blocks_total"):
            used, total = kv.get("blocks_used", 0), kv["blocks_total"]
            self.kv_label.setText(f"Chat memory {100 * used / total:.0f}% used")
            tip = f"Memory for conversations (the KV cache): {used} of {total} blocks in use"
            if kv.get("prefix_hit_rate") is not None:
                tip += (f".\n{100 * float(kv['prefix_hit_rate']):.0f}% of prompt tokens were reused from "
                        "earlier turns (prefix cache) instead of being read again")
            self.kv_label.setToolTip(tip)
        self.spec_label.setText(speculation_text(status.get("speculative")))
        self.spec_label.setToolTip(speculation_tip(status.get("speculative")))
        tok_s = status.get("generation_tok_s")
        if tok_s is not None:
            self.chart.add(float(tok_s))
            running = status.get("num_running")
            self.chart.setToolTip(f"Engine: {float(tok_s):.1f} tok/s" +
                                  (f", {running} running" if running is not None else ""))
        self._update_ram(status)

    def show_models(self, status: dict | None = None) -> None:
        """The loaded models by name (from /v1/models, which may answer after the first status: then again),
        the chat in view's marked; the tooltip says each one's memory and which open chats use it."""
        status = self.engine.last_status if status is None else status
        this_chat = self.engine.current_model if "models" in status else None  # one model: no mark needed
        self.model_label.setText(models_line(status, self.engine.model_names, this_chat))
        self.model_label.setToolTip(models_tooltip(status, self.engine.model_names, self._chats()))
        self.kv_label.setVisible(len(resident(status)) <= 1)  # one model's KV: the memory line speaks for several
        text, tip = memory_line(status)
        self.memory_label.setText(text)
        self.memory_label.setToolTip(tip)
        self.memory_label.setVisible(bool(text))

    def show_cached(self, _chat_id: int, usage) -> None:
        """The last reply's usage (app/openai_stream.py's Usage): how much of its prompt came from the cache."""
        text = cached_text(usage)
        self.cached_label.setText(text)
        self.cached_label.setToolTip(f"The last reply's prompt: {usage.cached_tokens:,} of its {usage.prompt_tokens:,} "
                                     "tokens were already in the engine's cache (memory or disk), so it did not "
                                     "read them again" if text else "")

    def _update_ram(self, status: dict | None = None) -> None:
        vm = psutil.virtual_memory()
        text = f"RAM {_gib(vm.total - vm.available)}/{_gib(vm.total)}"
        vram = (status or {}).get("vram") or {}
        if vram.get("total"):
            text += f" · VRAM {_gib(vram.get('used', 0))}/{_gib(vram['total'])}"
        self.ram_label.setText(text)


def busy_text(status: dict) -> str:
    """What the engine is doing for the chats, e.g. "Writing 2 replies · 1 waiting · 1 waiting for memory"
    (replies on every loaded model); "" when idle."""
    writing, waiting, queued = running(status), status.get("num_waiting") or 0, len(status.get("queue") or ())
    parts = ([f"Writing {'a reply' if writing == 1 else f'{writing} replies'}"] if writing else []) + \
        ([f"{waiting} waiting"] if waiting else []) + ([f"{queued} waiting for memory"] if queued else [])
    return " · ".join(parts)


def cached_text(usage) -> str:
    """E.g. "cached 1,840 of 1,900 prompt tokens" for a reply whose prompt's prefix came from the cache; "" when
    none did or the server does not say."""
    if usage is None or not usage.cached_tokens:
        return ""
    return f"cached {usage.cached_tokens:,} of {usage.prompt_tokens:,} prompt tokens"


DRAFTERS = {"ngram": "prompt lookup"}  # the engine's drafter names in the user's words; others: a draft model


def speculation_text(spec: dict | None) -> str:
    """E.g. "drafts 72% accepted" once the engine has checked drafts; "" while it does not speculate (or not yet)."""
    if not spec or not spec.get("draft_tokens") or spec.get("acceptance_rate") is None:
        return ""
    return f"drafts {100 * float(spec['acceptance_rate']):.0f}% accepted"


def speculation_tip(spec: dict | None) -> str:
    if not speculation_text(spec):
        return ""
    drafter = DRAFTERS.get(spec.get("drafter"), "a draft model")
    tip = (f"Speculative decoding ({drafter}), since the engine started: {spec['accepted_tokens']} of "
           f"{spec['draft_tokens']} drafted tokens accepted")
    if spec.get("tokens_per_target_pass"):
        tip += f"; {float(spec['tokens_per_target_pass']):.2f} tokens per pass of the model"
    if spec.get("verify_seconds") is not None:
        tip += (f".\nDrafting took {float(spec.get('draft_seconds') or 0):.1f} s, "
                f"checking {float(spec['verify_seconds']):.1f} s")
    return tip + ". The replies are the same as without it, only sooner."
