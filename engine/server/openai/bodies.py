"""OpenAI response bodies (chat.completion, chat.completion.chunk, text_completion) as dicts.

Shapes transcribed from OpenAI's API reference, like llama-cpp-python's `llama_types.py`:
chat logprobs are `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`;
completions logprobs are the legacy `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.
"""
from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0, drafted: int = 0,
          accepted: int = 0, reasoning_tokens: int | None = None) -> dict:
    """OpenAI's usage; speculative decoding's drafts in the fields OpenAI's predicted outputs use,
    a reasoning model's thinking in reasoning_tokens (counted in completion_tokens, as OpenAI's)."""
    use = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    details = {}
    if drafted:
        details = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": drafted - accepted}
    if reasoning_tokens is not None:
        details["reasoning_tokens"] = reasoning_tokens
    if details:
        use["completion_tokens_details"] = details
    return use


def finish_reason(reason: str | None) -> str | None:
    """The engine's "abort" never reaches a client that is still listening; say "stop" if it does."""
    return "stop" if reason == "abort" else reason


class TokenText:
    """Token id -> text and bytes for logprobs; a token may be part of a UTF-8 character."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


# ---- chat ---------------------------------------------------------------------------------------
def chat_logprob_items(tt: TokenText, lps) -> list[dict]:
    items = []
    for lp in lps or ():
        if lp is None:
            continue
        b = tt.bytes(lp.token_id)
        items.append({
            "token": tt.text(lp.token_id), "logprob": lp.logprob, "bytes": list(b),
            "top_logprobs": [{"token": tt.text(t), "logprob": v, "bytes": list(tt.bytes(t))}
                             for t, v in lp.top]})
    return items


def chat_chunk(rid: str, model: str, created: int, delta: dict, reason: str | None = None,
               logprobs: list[dict] | None = None, with_usage: bool = False) -> dict:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": 0, "delta": delta,
                          "logprobs": {"content": logprobs} if logprobs is not None else None,
                          "finish_reason": finish_reason(reason)}],
             "system_fingerprint": None}
    if with_usage:
        chunk["usage"] = None  # OpenAI: null on every chunk but the last, which carries it
    return chunk


def usage_chunk(rid: str, model: str, created: int, obj: str, use: dict) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": use, "system_fingerprint": None}


# ---- completions --------------------------------------------------------------------------------
class CompletionLogprobs:
    """Accumulates the legacy logprobs object; `text_offset` counts characters of the choice text."""

    def __init__(self, tt: TokenText, offset: int = 0) -> None:
        self.tt = tt
        self.offset = offset
        self.tokens: list[str] = []
        self.token_logprobs: list[float | None] = []
        self.top_logprobs: list[dict | None] = []
        self.text_offset: list[int] = []

    def add(self, token_id: int, lp) -> None:
        s = self.tt.text(token_id)
        self.tokens.append(s)
        self.text_offset.append(self.offset)
        self.offset += len(s)
        if lp is None:  # the first prompt token has nothing to be predicted from
            self.token_logprobs.append(None)
            self.top_logprobs.append(None)
            return
        self.token_logprobs.append(lp.logprob)
        top: dict[str, float] = {}
        for t, v in lp.top:
            top.setdefault(self.tt.text(t), v)
        self.top_logprobs.append(top)

    def take(self) -> dict:
        """The part gathered since the last take (for stream chunks), then reset."""
        d = {"tokens": self.tokens, "token_logprobs": self.token_logprobs,
             "top_logprobs": self.top_logprobs, "text_offset": self.text_offset}
        self.tokens, self.token_logprobs, self.top_logprobs, self.text_offset = [], [], [], []
        return d


def completion_choice(index: int, text: str, reason: str | None, logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason(reason)}


def completion(rid: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": use, "system_fingerprint": None}


def completion_chunk(rid: str, model: str, created: int, choice: dict, with_usage: bool) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [choice], "system_fingerprint": None}
    if with_usage:
        chunk["usage"] = None
    return chunk


def now() -> int:
    return int(time.time())
