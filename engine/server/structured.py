"""From a chat request to what its reply must be: the grammar (response_format, or a forced
tool call) and the tool syntax to parse the reply with. Every refusal is a 400 naming the
field and the construct; compiling runs in the thread pool, never on the event loop or the
engine thread (engine/grammar.py caches the results).
"""
from __future__ import annotations

from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from engine.grammar import ANY_JSON_OBJECT, Grammar, GrammarCompiler, GrammarError
from engine.server.errors import APIError
from engine.model_files.tool_call_syntax import ToolFormat, tool_format
from engine.server.tool_calls import forced_call_grammar
from engine.server.tool_protocol import ResponseFormat


@dataclass(slots=True)
class ReplyShape:
    grammar: Grammar | None = None
    tools: ToolFormat | None = None  # parse the reply for tool calls in this syntax
    template_tools: list[dict] | None = None  # what the chat template renders as `tools`


def grammar_compiler(engine) -> GrammarCompiler:
    """One compiler (and grammar cache) per loaded engine."""
    compiler = getattr(engine, "grammar_compiler", None)
    if compiler is None:
        compiler = engine.grammar_compiler = GrammarCompiler(engine.tokenizer)
    return compiler


async def response_format_grammar(engine, fmt: ResponseFormat | None,
                                  param: str = "response_format") -> Grammar | None:
    if fmt is None or fmt.type == "text":
        return None
    schema = ANY_JSON_OBJECT if fmt.type == "json_object" else fmt.json_schema.schema_
    if schema is None:
        raise APIError(400, f"{param}.json_schema.schema is required", param=f"{param}.json_schema",
                       code="invalid_value")
    try:
        return await run_in_threadpool(grammar_compiler(engine).json_schema, schema)
    except GrammarError as e:
        raise APIError(400, f"{param}: {e}", param=param, code="invalid_schema") from None


async def reply_shape(engine, body) -> ReplyShape:
    """The ReplyShape of a ChatCompletionRequest."""
    tools = body.active_tools
    if not tools:
        return ReplyShape(await response_format_grammar(engine, body.response_format))
    for i, t in enumerate(tools):
        if t.function.parameters is not None:
            try:
                GrammarCompiler.check_json_schema(t.function.parameters)
            except GrammarError as e:
                raise APIError(400, f"tools.{i}.function.parameters: {e}",
                               param=f"tools.{i}.function.parameters", code="invalid_schema") from None
    fmt = tool_format(engine.chat_template.source)
    if fmt is None:
        raise APIError(400, "this model's chat template has no tool support (it never renders "
                       "`tools`), so it cannot be given tools", param="tools", code="tools_unsupported")
    shape = ReplyShape(tools=fmt, template_tools=[{"type": "function", "function": t.function.template_dict()}
                                                  for t in tools])
    choice = body.tool_choice
    forcing = choice == "required" or (choice is not None and not isinstance(choice, str))
    if forcing and fmt is ToolFormat.HARMONY:
        raise APIError(400, "tool_choice that forces a call is not supported for harmony (gpt-oss) models yet; "
                       "use \"auto\"", param="tool_choice", code="invalid_value")
    if forcing:
        forced = tools if choice == "required" else [t for t in tools if t.function.name == choice.function.name]
        compiler = grammar_compiler(engine)
        special = lambda text: engine.tokenizer.encode(text, add_bos=False)[0]  # noqa: E731
        source = forced_call_grammar(fmt, forced, body.parallel_tool_calls and choice == "required", special)
        try:
            shape.grammar = await run_in_threadpool(compiler.lark, source)
        except GrammarError as e:
            raise APIError(400, f"tools: {e}", param="tools", code="invalid_schema") from None
    return shape
