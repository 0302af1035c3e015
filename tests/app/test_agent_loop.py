"""The agent loop end to end: a real engine serving scripted tool-calling models (each model's greedy
reply is one call, then a fixed answer once the prompt ends with a tool result), real MCP servers
over stdio, and the engine's own template and call parsing in between."""
from __future__ import annotations

import json
import time

import pytest

from app.agent.loop import AgentConfig, AgentRun, ReplyStarted, StepEvent, StepLimitReached
from app.agent.mcp_config import parse_config
from app.agent.mcp_host import McpHost
from app.agent.steps import Approval, CallStatus
from app.agent.toolbox import Toolbox
from app.client import ChatDelta, EngineClient
from engine_process import write_manifest
from mcp_test_server import lookup_value
from mcp_util import stdio_server_entry
from scripted_gguf import TOOL_ANSWER, write_tool_model
from server_util import start_engine

CTX = 4096  # what the loop is told the context is (the files have 8192: the cut must fit this)
CALLS = {
    "lookup": {"name": "lookup", "arguments": {"key": "door"}},
    "bad-args": {"name": "add", "arguments": {"a": "one", "b": 2}},
    "sleeper": {"name": "sleep", "arguments": {"seconds": 60}},
    "crasher": {"name": "crash", "arguments": {}},
    "big": {"name": "big", "arguments": {"n": 200000}},
    "unknown": {"name": "no_such_tool", "arguments": {}},
    "prefixed": {"name": "b__lookup", "arguments": {"key": "door"}},
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    models = root / "models"
    for model_id, call in CALLS.items():
        write_manifest(models, model_id, write_tool_model(root / f"{model_id}.gguf", call, ctx=8192))
    proc = start_engine(root / "lookup.gguf", root, "--models-dir", str(models), "--max-loaded-models", "8")
    yield EngineClient(proc.base_url, proc.api_key)
    proc.stop()


@pytest.fixture
def host():
    h = McpHost(parse_config({"mcpServers": {"a": stdio_server_entry(), "b": stdio_server_entry(
        MCP_TEST_NAME="b", MCP_TEST_SECRET="b-secret")}}), start_timeout_s=60)
    yield h
    h.close()


def run(engine, host, model, servers=("a",), approve=lambda step, tool: Approval.ONCE, **config):
    states = host.start(servers)
    box = Toolbox.of(t for s in states.values() for t in s.tools)
    messages = [{"role": "user", "content": "What is stored under door?"}]
    agent = AgentRun(engine, messages, box, host, approve, AgentConfig(**config), model=model,
                     sampling={"temperature": 0, "max_tokens": 64}, context_tokens=CTX)
    events = list(agent.run())
    steps = [e.step for e in events if isinstance(e, StepEvent) and e.step.status is not CallStatus.RUNNING]
    text = "".join(e.text for e in events if isinstance(e, ChatDelta))
    return agent, events, steps, text


def test_call_result_answer(engine, host):
    asked = []
    agent, events, steps, text = run(engine, host, "lookup", approve=lambda s, t: asked.append((s.name, t.server))
                                     or Approval.ONCE)
    (step,) = steps
    assert asked == [("lookup", "a")]
    assert (step.server, step.tool, json.loads(step.arguments)) == ("a", "lookup", {"key": "door"})
    assert step.status is CallStatus.OK and step.result == lookup_value("door") and step.seconds >= 0
    assert text == TOOL_ANSWER and [type(e) for e in events].count(ReplyStarted) == 2
    first, second = [e for e in events if isinstance(e, ReplyStarted)]
    assert 0 < first.t_sent < second.t_sent <= time.monotonic()  # each reply's own request: its ttft's start
    call, result = agent.messages[1], agent.messages[2]  # as the next request carried them
    assert call["tool_calls"][0]["function"]["name"] == "lookup"
    assert result == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "name": "lookup",
                      "content": lookup_value("door")}


def test_a_denied_call_goes_back_as_a_refusal_and_always_is_remembered(engine, host):
    _, _, (step,), text = run(engine, host, "lookup", approve=lambda s, t: Approval.DENY)
    assert step.status is CallStatus.DENIED and "denied" in step.result and text == TOOL_ANSWER
    asked = []
    agent, _, (step,), _ = run(engine, host, "lookup", approve=lambda s, t: asked.append(1) or Approval.ALWAYS)
    assert step.status is CallStatus.OK and agent.always_allowed == {("a", "lookup")} and asked == [1]


def test_invalid_arguments_never_reach_the_server(engine, host):
    _, _, (step,), text = run(engine, host, "bad-args", approve=lambda s, t: pytest.fail("asked"))
    assert step.status is CallStatus.INVALID and "not of type 'integer'" in step.result
    assert "not called" in step.result and text == TOOL_ANSWER


def test_a_slow_tool_is_cancelled_after_the_timeout(engine, host):
    _, _, (step,), text = run(engine, host, "sleeper", call_timeout_s=1.0)
    assert step.status is CallStatus.TIMEOUT and "longer than 1 s" in step.result and text == TOOL_ANSWER
    assert host.call_tool("a", "lookup", {"key": "k"}, 30).text == lookup_value("k")  # the server goes on


def test_a_crashing_server_leaves_the_chat_working(engine, host):
    _, _, (step,), text = run(engine, host, "crasher")
    assert step.status is CallStatus.UNAVAILABLE and "stopped" in step.result and text == TOOL_ANSWER
    _, _, (again,), _ = run(engine, host, "lookup", servers=("a", "b"))  # a's tools are gone now; b's remain
    assert again.server == "b" and again.result == lookup_value("door", "b-secret")


def test_an_oversized_result_is_cut_to_the_context_with_a_note(engine, host):
    _, _, (step,), text = run(engine, host, "big")
    assert step.status is CallStatus.OK and step.truncated and "cut: the result was 200,000 characters" in step.result
    assert len(step.result) < CTX and text == TOOL_ANSWER


def test_unknown_tools_and_colliding_names(engine, host):
    _, _, (step,), _ = run(engine, host, "unknown")
    assert step.status is CallStatus.UNAVAILABLE and "no tool named 'no_such_tool'" in step.result
    _, _, (step,), _ = run(engine, host, "prefixed", servers=("a", "b"))  # both serve lookup: a__lookup, b__lookup
    assert (step.server, step.tool, step.result) == ("b", "lookup", lookup_value("door", "b-secret"))


def test_the_step_limit_ends_the_calls_and_asks_for_an_answer(engine, host):
    agent, events, steps, text = run(engine, host, "lookup", step_limit=1)
    limit = next(i for i, e in enumerate(events) if isinstance(e, StepLimitReached))
    assert len(steps) == 1 and isinstance(events[limit - 1], StepEvent) and text == TOOL_ANSWER
    agent, events, steps, _ = run(engine, host, "lookup", step_limit=0)
    assert steps == [] and isinstance(events[0], StepLimitReached)
    assert "tools" not in agent.messages[-1]  # nothing but the question went out: no tools were offered
