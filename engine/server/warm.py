"""Warming a chat (`POST /v1/engine/warm`): its prompt computed into the prefix cache before the
user's next turn, so that turn's first token comes at once.

The app sends it when the user opens a chat, with the body the next turn would send but for the
new message. The messages go through the model's chat template with an empty user turn after
them, cut where that turn's text would start: the text every next turn begins with, however the
template renders the last reply (Qwen3's drops a `<think>` block once a user turn follows it). The
prompt runs as background work (`SamplingParams.background`: tokens only in steps that no request
needs, the first sequence preempted) and samples one token, thrown away. Its full blocks stay in
the prefix cache (read back from the disk tier when they are there, computed otherwise; on the
llama.cpp runner its slot keeps the cells); the answer, once they are, says how many prompt tokens
there were and how many came from a cache. A warm holds its model only until it is queued: a model
with nothing but a warm is idle, unloaded (the warm ended, 503) for a request that needs its room.
"""
from __future__ import annotations

from starlette.requests import Request

from engine.loaders.chat_template import TemplateError
from engine.sampling_params import SamplingParams
from engine.server.chat_images import encode_chat
from engine.server.errors import APIError
from engine.server.model_use import release_early, use_model
from engine.server.openai import bodies as R
from engine.server.openai.protocol import ChatCompletionRequest
from engine.server.serving import Job
from engine.server.structured import reply_shape

TURN_MARK = "\ue000ember-next-turn\ue000"  # a private-use text no template changes: where the next turn starts


async def warm_chat(request: Request, body: ChatCompletionRequest) -> dict:
    """Compute the chat's prompt as background work; {"model", "prompt_tokens", "cached_tokens"} when done."""
    loaded = await use_model(request, body.model)
    engine = loaded.engine
    shape = await reply_shape(engine, body)
    prompt = warm_prompt(engine, body, shape.template_tools)
    ids, images = await encode_chat(engine, body, prompt)
    ids = ids[:engine.max_model_len - 1]  # a turn needs a token of room; what the context cannot hold, no turn reads
    job = Job(request.app.state.engine_thread, request, metered=False)  # no request's figures
    try:
        job.submit(ids, SamplingParams(temperature=0.0, max_tokens=1, background=True), R.new_id("warm"), engine,
                   images)
        release_early(request, loaded.spec.id)  # queued: a request for another model may unload it, the warm ended
        out = None
        async for _, out in job:
            pass
    finally:
        job.close()
    return {"object": "engine.warm", "model": loaded.spec.id, "prompt_tokens": len(ids),
            "cached_tokens": out.num_cached_tokens if out is not None else 0}


def warm_prompt(engine, body: ChatCompletionRequest, template_tools) -> str:
    """The messages through the chat template, up to where the next user turn's text would begin."""
    extra = body.template_variables | ({"tools": template_tools} if template_tools else {})
    messages = [m.as_template_dict() for m in body.messages]
    try:
        text = engine.chat_template.render(messages + [{"role": "user", "content": TURN_MARK}],
                                           add_generation_prompt=False, **extra)
    except TemplateError:  # e.g. a template that wants roles to alternate, and the chat ends with a user turn
        text = None
    if text is None or TURN_MARK not in text:
        try:
            return engine.chat_template.render(messages, add_generation_prompt=False, **extra)
        except TemplateError as e:
            raise APIError(400, f"the chat template refused the messages: {e}", param="messages") from None
    return text[:text.index(TURN_MARK)]
