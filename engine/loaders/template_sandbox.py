"""A jinja2 environment for untrusted chat templates: no Python internals, bounded work and size.

Chat templates come from model files anyone can publish. jinja2's ImmutableSandboxedEnvironment
already refuses `_`-attributes, frame/code internals and mutating builtins; on top of it:
  * an unsafe attribute fails at once (the stock sandbox hands back an Undefined that prints
    as "" until something touches it), so `{{ ''.__class__ }}` is an error, not silence;
  * a budget per render: every loop iteration and every call is a step, checked against a step
    limit and a wall-clock deadline, so `range(10**5)` nested three deep stops in seconds;
    loops are guarded by rewriting `{% for x in it %}` to `{% for x in _ember_iter(it) %}` in
    the parsed tree before compiling (jinja2's public parse → from_string(ast) path);
  * size checks before the big allocations a template can ask for in one operation: `s * n`,
    `a + b`, `a ~ b`, `x ** y`, width/count arguments of string methods and filters, `%`-format
    widths, and the streamed output itself.
Only a separate process with rlimits could promise more; these bound every construct that a
hostile template can write in a few characters.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Any

from jinja2 import Environment, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MAX_STEPS = 1_000_000  # loop iterations + calls per render
MAX_SECONDS = 2.0  # wall clock per render
MAX_CHARS = 1 << 20  # base size limit of any string/list built and of the output (+ input size)
_WIDTH = re.compile(r"%[-+ #0]*(\*|\d{5,})|%[-+ #0]*\d*\.(\*|\d{5,})|\{[^{}]*:[^{}]*\d{5,}")


class TemplateBudgetError(SecurityError):
    """The template tried to do too much work or build too much text."""


class _Budget(threading.local):
    steps = 0
    deadline = float("inf")
    max_chars = MAX_CHARS


class _GenerationTag(Extension):
    """HF's `{% generation %}...{% endgeneration %}` (assistant-mask marker): render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class SafeTemplateEnvironment(ImmutableSandboxedEnvironment):
    """HF's chat-template environment (trim_blocks, lstrip_blocks, loopcontrols), hardened."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                         extensions=[loopcontrols, _GenerationTag], autoescape=False)
        self.budget = _Budget()
        self.globals.pop("lipsum", None)  # lipsum(n=10**9) would generate n paragraphs
        self.globals["_ember_iter"] = self._guard_iter
        self.globals["_ember_concat"] = self._guard_concat
        for name in ("center", "indent", "wordwrap", "truncate", "batch", "slice", "replace",
                     "join", "format"):
            self.filters[name] = self._guard_filter(self.filters[name])

    # ---- compile: parse, rewrite loops and concatenations, then compile the tree ------------
    def compile_template(self, source: str):
        tree = self.parse(source)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.Name("_ember_iter", "load"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        for cat in list(tree.find_all(nodes.Concat)):
            cat.nodes = [nodes.Call(nodes.Name("_ember_concat", "load"), list(cat.nodes), [], None,
                                    None, lineno=cat.lineno)]
        tree.set_environment(self)
        return self.from_string(tree)

    # ---- the budget ------------------------------------------------------------------------
    def start(self, input_chars: int) -> None:
        b = self.budget
        b.steps, b.deadline = 0, time.monotonic() + MAX_SECONDS
        b.max_chars = MAX_CHARS + 4 * input_chars

    def step(self) -> None:
        b = self.budget
        b.steps += 1
        if b.steps > MAX_STEPS:
            raise TemplateBudgetError(f"the template ran more than {MAX_STEPS:,} loop steps/calls")
        if b.steps % 64 == 0 and time.monotonic() > b.deadline:
            raise TemplateBudgetError(f"rendering took longer than {MAX_SECONDS} s")

    def check_size(self, n: int, what: str = "a value") -> None:
        if n > self.budget.max_chars:
            raise TemplateBudgetError(f"the template tried to build {what} of {n:,} items "
                                      f"(limit {self.budget.max_chars:,})")

    def _guard_iter(self, iterable: Any):
        for item in iterable:
            self.step()
            yield item

    def _guard_concat(self, *parts: Any) -> str:
        parts = [str(p) for p in parts]
        self.check_size(sum(map(len, parts)), "a string")
        return "".join(parts)

    # ---- sandbox hooks ---------------------------------------------------------------------
    def unsafe_undefined(self, obj: Any, attribute: str):
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} "
                            "object is not allowed in a chat template")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
        __self.step()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, list, tuple)):
            __self._check_method(owner, getattr(__obj, "__name__", ""), args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":  # the common case (message concatenation): keep it cheap
            if type(left) is str and type(right) is str:
                if len(left) + len(right) > self.budget.max_chars:
                    self.check_size(len(left) + len(right), "a concatenation")
                return left + right
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                self.check_size(len(left) + len(right), "a concatenation")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    self.check_size(len(seq) * max(n, 0), "a repeated sequence")
        elif operator == "**":
            if isinstance(right, int) and abs(right) > 4096 and not (
                    isinstance(left, int) and abs(left) <= 1):
                raise TemplateBudgetError("exponent too large")
        elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
            raise TemplateBudgetError("format width too large")
        return self.binop_table[operator](left, right)

    def wrap_str_format(self, value: Any):
        fmt = super().wrap_str_format(value)
        if fmt is not None and _WIDTH.search(value.__self__):
            raise TemplateBudgetError("format width too large")
        return fmt

    def _check_method(self, owner: Any, name: str, args: tuple, kwargs: dict) -> None:
        """Width/count arguments of str methods (ljust, center, zfill, expandtabs, replace...)."""
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and a > self.budget.max_chars:
                raise TemplateBudgetError(f"argument {a:,} to {name}() is too large")
        if name == "replace" and len(args) >= 2 and isinstance(owner, str):
            self.check_size(len(owner) + owner.count(str(args[0])) * len(str(args[1])), "a string")
        if name == "join" and args and isinstance(owner, str):
            seq = args[0] if isinstance(args[0], (str, list, tuple)) else ()
            self.check_size(len(owner) * len(seq), "a joined string")

    def _guard_filter(self, f):
        """Check a filter's arguments before it runs and its result after."""
        env, name = self, f.__name__.removeprefix("do_")

        def guarded(*args: Any, **kwargs: Any):
            rest = list(args)
            while rest and _is_jinja_internal(rest[0]):  # @pass_eval_context/@pass_environment
                rest.pop(0)
            value, extra = (rest[0], rest[1:]) if rest else (None, [])
            if name == "join":  # value|join(sep): sep repeated len(value) times
                sep = extra[0] if extra else kwargs.get("d", "")
                if hasattr(value, "__len__") and isinstance(sep, str):
                    env.check_size(len(sep) * len(value), "a joined string")
            elif name == "format" and isinstance(value, str) and _WIDTH.search(value):
                raise TemplateBudgetError("format width too large")
            else:
                env._check_method(value if isinstance(value, str) else "", name, extra, kwargs)
            out = f(*args, **kwargs)
            if isinstance(out, (str, list, tuple)):
                env.check_size(len(out), "a filter result")
            return out

        if hasattr(f, "jinja_pass_arg"):  # keep the marker so jinja2 passes the same context
            guarded.jinja_pass_arg = f.jinja_pass_arg
        guarded.__name__ = f.__name__
        return guarded


def _is_jinja_internal(a: Any) -> bool:
    return isinstance(a, (nodes.EvalContext, Environment))
