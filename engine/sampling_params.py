"""What a request asks of the sampler and of the stopping rules."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.grammar import Grammar


@dataclass(frozen=True, slots=True)
class ThinkTags:
    """A reasoning model's single-token `<think>` and `</think>`, and whether the prompt left the
    block open (the reply starts inside it)."""
    open_id: int
    close_id: int
    starts_inside: bool = False


@dataclass(frozen=True, slots=True)
class ThinkingBudget:
    """At most `max_tokens` inside a `<think>` block: at the limit the engine writes the closing
    tag itself in place of the next sampled token (llama.cpp's --reasoning-budget), and the
    answer follows. The tags must be single tokens; the block may be open from the prompt on."""
    max_tokens: int
    open_id: int
    close_id: int
    starts_inside: bool = False


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # CTRL-style: divides positive logits of seen tokens
    frequency_penalty: float = 0.0  # OpenAI-style: minus count·f
    presence_penalty: float = 0.0  # OpenAI-style: minus p if seen
    seed: int | None = None  # same seed, same text
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's logprob plus top k
    prompt_logprobs: int | None = None  # score the prompt too (completions with echo)
    priority: int = 0  # lower runs first: interactive chats 0, background API jobs 1
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows
    speculative: bool = True  # False: never draft for this request (the API's "speculative": "off")
    thinking_budget: ThinkingBudget | None = None  # a reasoning model's thinking, capped (no drafts then)
    # With a grammar: the model thinks first, and the grammar holds from after `</think>`
    # (llama.cpp's lazy grammar); a reply whose first token does not open the block is held from
    # its start (sampling/constrained.py)
    grammar_after_think: ThinkTags | None = None
    # control tokens as their text in the reply: a harmony model's channel markup, which the
    # server's reasoning parser reads and takes out (engine/server/reasoning.py)
    render_special: bool = False
    # an embedding, not a reply: no token is sampled; the result is the mean of the prompt's final
    # (normed) hidden states, llama.cpp's mean pooling of its embeddings output (t_embd)
    embed: bool = False
    # work nobody waits for (warming a chat's prefix cache): it runs only in steps with no other
    # request to serve and is the first to be preempted (Scheduler, BACKGROUND_PRIORITY)
    background: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= 20:
                raise ValueError(f"{name} must be between 0 and 20")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
