"""The chat pipeline every API shares: a ChatCompletionRequest (OpenAI's chat body, which
Ollama's and Anthropic's requests are translated to) becomes a prompt through the model's chat
template, is fitted to the context, and is submitted as n choices; each `ChatChoice` turns the
outputs into answer text, reasoning and tool calls (as OpenAI-shaped deltas when streamed).
The wire protocols (engine/server/openai/, ollama/, anthropic/) shape the replies.

`start_chat` waits for the first result before a route answers, so an error the engine finds is
still a proper 4xx and not a broken stream. With n > 1 the first choice is submitted alone and
the others once it has its first token: by then its prompt's KV exists, and the others start
from it (the torch runner's prefix cache shares its blocks, llama.cpp's slots copy its cells), so
the prompt is computed once; `ember_prompt_cached_tokens_total` counts what they reused. A
reasoning model's thinking (a `<think>` block, found from the chat template: reasoning.py) goes
to `reasoning`, apart from the answer, which alone is parsed for tool calls.
"""
from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from engine.loaders.chat_template import TemplateError
from engine.model_files.tool_call_syntax import ToolFormat, may_start_call, parse_tool_calls
from engine.sampling_params import ThinkingBudget, ThinkTags
from engine.server.errors import APIError
from engine.server.openai import bodies as R
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.chat_images import encode_chat
from engine.server.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningFormat, ReasoningParser, reasoning_format
from engine.server.model_use import use_model
from engine.server.serving import Job, fit_context, sampling_params
from engine.server.structured import ReplyShape, reply_shape


class ChatChoice:
    """One choice, filled from its RequestOutputs. With tools, streamed text that may begin a
    tool call is held back until the reply ends and is parsed."""

    def __init__(self, index: int, tools: ToolFormat | None, reasoning: ReasoningParser | None = None,
                 tool_names: frozenset[str] = frozenset()) -> None:
        self.index, self.tools, self.parser, self.tool_names = index, tools, reasoning, tool_names
        self.text, self.sent = "", 0  # all answer text; how much of it went out as content
        self.raw = ""  # the reply as written (harmony's tool calls are read from its markup)
        self.reasoning, self.reasoning_sent = "", 0  # the thinking, and how much of it went out
        self.reasoning_tokens = 0  # tokens of the thinking block, its tags included
        self.lps: list = []
        self.reason: str | None = None
        self.calls: list = []
        self.content: str | None = None
        self.completion_tokens = self.cached = 0
        self.drafted = self.accepted = 0  # speculative decoding's draft tokens, verified / accepted
        self.started = False

    def add(self, out) -> None:
        text = out.new_text
        self.raw += text
        if self.parser is not None:
            was_open = self.parser.reasoning_open
            thought, text = self.parser.feed(text)
            if out.finished:
                more_thought, more_text = self.parser.finish()
                thought, text = thought + more_thought, text + more_text
            if was_open or self.parser.reasoning_open:  # the block's tokens, its tags included
                self.reasoning_tokens += len(out.new_token_ids)
            self.reasoning += thought
        self.text += text
        self.lps += out.logprobs or []
        self.completion_tokens = len(out.output_token_ids)
        self.drafted, self.accepted = out.num_spec_proposed, out.num_spec_accepted
        if out.finished:
            self.reason, self.cached = R.finish_reason(out.finish_reason), out.num_cached_tokens
            self.content = self.text
            if self.tools is ToolFormat.HARMONY:
                _, calls = parse_tool_calls(self.tools, self.raw)
                if calls:
                    self.content, self.calls, self.reason = self.text or None, calls, "tool_calls"
            elif self.tools is not None:
                content, calls = parse_tool_calls(self.tools, self.text, self.tool_names)
                if calls:
                    self.content, self.calls, self.reason = content or None, calls, "tool_calls"

    def message(self) -> dict:
        m = {"role": "assistant", "content": self.content}
        if self.reasoning:
            m["reasoning_content"] = self.reasoning
        if self.calls:
            m["tool_calls"] = [c.as_openai() for c in self.calls]
        return m

    def stream_deltas(self, out, tt: R.TokenText, logprobs: bool):
        """(delta, finish_reason, logprob items) for what `out` added."""
        items = R.chat_logprob_items(tt, out.logprobs) if logprobs and out.logprobs else None
        if not self.started:
            self.started = True
            yield {"role": "assistant", "content": ""}, None, None
        if len(self.reasoning) > self.reasoning_sent:
            yield {"reasoning_content": self.reasoning[self.reasoning_sent:]}, None, None
            self.reasoning_sent = len(self.reasoning)
        if self.reason is None:
            safe = len(self.text) if self.tools is None else may_start_call(self.tools, self.text)
            if safe > self.sent or items:
                text, self.sent = self.text[self.sent:max(safe, self.sent)], max(safe, self.sent)
                yield {"content": text}, None, items
            return
        if self.calls:
            yield {"tool_calls": [c.as_openai(i) for i, c in enumerate(self.calls)]}, None, None
        elif len(self.text) > self.sent or items:
            text, self.sent = self.text[self.sent:], len(self.text)
            yield {"content": text}, None, items
        yield {}, self.reason, None


@dataclass(slots=True)
class ChatRun:
    """A chat request submitted to the engine, its first output received."""
    engine: object
    model: str
    rid: str
    prompt_ids: list[int]
    job: Job  # its first output received (Job.first), which iterating it yields again
    index: dict[str, int]  # engine request id -> choice index
    choices: list[ChatChoice]

    async def collect(self) -> None:
        """Feed every output to its choice until all are finished (a reply that is not streamed)."""
        try:
            async for rid, out in self.job:
                self.choices[self.index[rid]].add(out)
        finally:
            self.job.close()


async def start_chat(request: Request, body: ChatCompletionRequest, prefix: str) -> ChatRun:
    """Model, reply shape, prompt, context, params; submit the n choices (see the docstring)."""
    state = request.app.state
    loaded = await use_model(request, body.model)
    engine = loaded.engine
    shape = await reply_shape(engine, body)
    prompt = render_prompt(engine, body, shape)
    ids, images = await encode_chat(engine, body, prompt, state.settings.fetch_image_urls)
    max_tokens = body.requested_max_tokens
    if max_tokens == 0:
        raise APIError(400, "max_tokens must be at least 1", param="max_tokens", code="invalid_value")
    n = len(ids)
    ids, max_tokens = fit_context(ids, max_tokens, body.truncate_prompt_tokens, engine.max_model_len,
                                  fit=body.max_tokens_fit)
    if images and len(ids) != n:  # positions would move under the images
        raise APIError(400, "a prompt with images cannot be truncated", param="truncate_prompt_tokens")
    vocab = engine.tokenizer.vocab_size
    params = [sampling_params(body, max_tokens, vocab, body.num_logprobs, grammar=shape.grammar, choice=i)
              for i in range(body.n)]
    fmt, inside = reasoning_format(engine.chat_template, prompt)
    tags = think_tags(engine, fmt, inside)
    if shape.grammar is not None and tags is None:  # the grammar holds the reply from its first token
        fmt, inside = ReasoningFormat.NONE, False
    budget = thinking_budget(fmt, tags, body.max_reasoning_tokens, state)
    for p in params:  # the plain fallback layout's next-turn labels (ChatTemplate.turn_stops)
        p.stop = [*p.stop, *(t for t in engine.chat_template.turn_stops if t not in p.stop)]
        p.thinking_budget = budget
        if shape.grammar is not None:  # it thinks first; the grammar holds from after </think>
            p.grammar_after_think = tags
        p.render_special = fmt is ReasoningFormat.HARMONY  # the parser reads the channel markup
    rid = R.new_id(prefix)
    job = Job(state.engine_thread, request)
    subs = [f"{rid}-{i}" for i in range(body.n)]
    job.submit(ids, params[0], subs[0], engine, images)
    await job.first()
    for i in range(1, body.n):  # the prompt's KV now exists: these start from it
        job.submit(ids, params[i], subs[i], engine, images)
    return ChatRun(engine, loaded.spec.id, rid, ids, job, {s: i for i, s in enumerate(subs)},
                   [ChatChoice(i, shape.tools, ReasoningParser(fmt, inside) if fmt is not ReasoningFormat.NONE
                               else None, tool_names(shape)) for i in range(body.n)])


def tool_names(shape: ReplyShape) -> frozenset[str]:
    return frozenset(t["function"]["name"] for t in shape.template_tools or ())


def render_prompt(engine, body: ChatCompletionRequest, shape: ReplyShape) -> str:
    """The messages (and tools) through the model's chat template, ready for the reply; with
    continue_final_message, ready for the rest of the last one (`continued`)."""
    extra = body.template_variables | ({"tools": shape.template_tools} if shape.template_tools else {})
    messages = body.messages[:-1] if body.continue_final_message else body.messages
    try:
        prompt = engine.chat_template.render([m.as_template_dict() for m in messages],
                                             add_generation_prompt=True, **extra)
    except TemplateError as e:
        raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None
    if not body.continue_final_message:
        return prompt
    last = body.messages[-1]
    if last.reasoning_content and reasoning_format(engine.chat_template, prompt)[0] is not ReasoningFormat.THINK_TAGS:
        raise APIError(400, "only a model that thinks in <think> tags can continue its reasoning_content",
                       param="messages", code="invalid_value")
    return prompt + continued(prompt, last.reasoning_content or "", last.text)


def continued(prompt: str, reasoning: str, text: str) -> str:
    """What follows the generation prompt when a reply is continued: its thoughts in a <think>
    block (opened here unless the prompt's tail opened it) and left open while it has no answer,
    then its answer so far. The reasoning parser then starts inside the block (reasoning_format
    reads the prompt's tail), so the rest of the thoughts stream as reasoning."""
    if not reasoning:
        return text
    opened = prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)
    return ("" if opened else THINK_OPEN + "\n") + reasoning + (f"{THINK_CLOSE}\n\n{text}" if text else "")


def think_tags(engine, fmt: ReasoningFormat, inside: bool) -> ThinkTags | None:
    """The model's <think> tags as single tokens (what the engine needs to budget thinking and to
    start a grammar after it), or None: no <think> format, or tags that are several tokens."""
    if fmt is not ReasoningFormat.THINK_TAGS:
        return None
    ids = [engine.tokenizer.encode(tag, add_bos=False, parse_special=True) for tag in (THINK_OPEN, THINK_CLOSE)]
    return ThinkTags(ids[0][0], ids[1][0], inside) if all(len(i) == 1 for i in ids) else None


def thinking_budget(fmt: ReasoningFormat, tags: ThinkTags | None, requested: int | None,
                    state) -> ThinkingBudget | None:
    """The request's cap on thinking, else the server's (--max-reasoning-tokens); none without a
    <think> format. The tags must be single tokens for the engine to write the closing one."""
    settings = getattr(state, "settings", None)
    limit = requested if requested is not None else getattr(settings, "max_reasoning_tokens", None)
    if limit is None or fmt is not ReasoningFormat.THINK_TAGS:
        return None
    if tags is None:
        raise APIError(400, "this model's <think> tags are not single tokens: its thinking cannot be budgeted",
                       param="max_reasoning_tokens", code="invalid_value")
    return ThinkingBudget(limit, tags.open_id, tags.close_id, tags.starts_inside)
