"""Grammars for constrained decoding: JSON schemas and Lark grammars compiled to token masks.

Built on llguidance rather than xgrammar (both are what vLLM, SGLang and llama.cpp use): its
wheel is one Rust extension with no dependencies (xgrammar pulls torch, transformers and triton),
it needs no per-vocabulary precomputation (a 152k vocabulary is ready in about a second and a
schema compiles in about a millisecond), it computes a mask in well under a millisecond with its
lexer and token trie, it is the engine llama.cpp itself links, and its JSON-schema compiler names
the keyword it cannot enforce, which becomes the 400 a client sees.

No torch here: the server compiles (in its thread pool, never on the engine thread) and the
sampler (engine/sampling/constrained.py) takes per-request matchers from the compiled `Grammar`.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

# Compact JSON (no free whitespace): a small model cannot loop on blank lines, and every reply
# is as short as its content.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_JSON_OBJECT = {"type": "object"}
_CACHE_SIZE = 256


class GrammarError(ValueError):
    """A schema or grammar the engine cannot enforce; the message names the construct."""


@dataclass(frozen=True, slots=True, eq=False)
class Grammar:
    """A compiled grammar; each request decodes with its own `matcher()` (a cheap copy)."""

    source: str  # llguidance's grammar text, the cache key
    _template: llguidance.LLMatcher
    vocab_size: int  # bits in a mask
    eos_ids: tuple[int, ...]  # what a finished grammar allows

    def matcher(self) -> llguidance.LLMatcher:
        return self._template.deep_copy()


class _TokenizerView:
    """What llguidance's TokenizerWrapper reads from a tokenizer: every token's bytes, the
    special ids and an encode callback (Ember's llama.cpp tokenizer, so ids agree)."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else 0
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)]

    def __call__(self, text: bytes | str) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_bos=False, parse_special=False)


class GrammarCompiler:
    """Compiles and caches grammars for one tokenizer; thread-safe, called off the engine thread."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._lltok: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Grammar] = OrderedDict()

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        """Built on first use (about a second for 152k tokens), then shared."""
        with self._lock:
            if self._lltok is None:
                tok = self._tokenizer
                eos = sorted(tok.stop_ids) or [tok.eos_id or 0]
                self._lltok = llguidance.LLTokenizer(
                    llguidance.TokenizerWrapper(_TokenizerView(tok)), eos_token=eos)
            return self._lltok

    def json_schema(self, schema: dict | bool) -> Grammar:
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be an object")
        return self.compile(self.json_grammar(schema))

    @staticmethod
    def json_grammar(schema: dict, lenient: bool = False) -> str:
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), overrides={**JSON_OPTIONS, "lenient": lenient})
        except Exception as e:  # llguidance raises ValueError, or RuntimeError on what it cannot read
            raise GrammarError(f"the JSON schema is not valid: {e}") from None

    @staticmethod
    def check_json_schema(schema: dict) -> None:
        """GrammarError if `schema` is malformed; keywords it cannot enforce are let through
        (a tool's parameters under tool_choice auto are shown to the model, not enforced)."""
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be an object")
        try:
            message = llguidance.LLMatcher.validate_grammar(GrammarCompiler.json_grammar(schema, lenient=True))
        except GrammarError:
            raise
        except Exception as e:
            message = str(e)
        if message:
            raise GrammarError(_explain(message).replace("cannot be enforced", "is not valid"))

    def json_object(self) -> Grammar:
        return self.json_schema(ANY_JSON_OBJECT)

    def lark(self, text: str) -> Grammar:
        return self.compile(llguidance.LLMatcher.grammar_from_lark(text))

    def compile(self, source: str) -> Grammar:
        """The cached Grammar for llguidance grammar text; GrammarError if it cannot be built."""
        with self._lock:
            hit = self._cache.get(source)
            if hit is not None:
                self._cache.move_to_end(source)
                return hit
        lltok = self.lltokenizer
        try:
            bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(source, lltok)
            matcher = None if bad else llguidance.LLMatcher(lltok, source, log_level=0)
        except Exception as e:  # a grammar llguidance cannot even read
            bad, messages = True, [str(e)]
        if bad:
            raise GrammarError(_explain(messages[0] if messages else "invalid grammar"))
        if matcher.is_error():
            raise GrammarError(_explain(matcher.get_error()))
        grammar = Grammar(source, matcher, lltok.vocab_size, tuple(lltok.eos_tokens))
        with self._lock:
            self._cache[source] = grammar
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar


def _explain(message: str) -> str:
    """llguidance's message, shortened to its first line and said as what we cannot enforce."""
    first = message.strip().splitlines()[0] if message.strip() else "invalid grammar"
    return f"the schema cannot be enforced: {first}"
