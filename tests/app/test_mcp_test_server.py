"""The test kit's MCP server (tests/mcp_test_server.py), started as tests/mcp_util.py starts it,
answers the official SDK's own client over stdio and Streamable HTTP: its tools with JSON input
schemas, their results, its prompt and resource; `crash` ends the connection. Other tests of
issue 64 build on this server, so what it does is pinned here."""
from __future__ import annotations

import tempfile

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from mcp_test_server import FAIL_LINE, NOTES_TEXT, NOTES_URI, READY_LINE, big_text, lookup_value
from mcp_util import port_answers, http_server, stdio_server_entry

TOOLS = {"lookup", "add", "sleep", "crash", "big", "fail"}


async def exercise(server) -> dict:
    """What the SDK's client sees of the server, in one session."""
    async with Client(server) as c:
        tools = {t.name: t.input_schema for t in (await c.list_tools()).tools}
        results = {name: await c.call_tool(name, args) for name, args in (
            ("lookup", {"key": "door"}), ("add", {"a": 2, "b": 40}), ("sleep", {"seconds": 0.01}),
            ("big", {"n": 25}), ("fail", {}))}
        prompt = await c.get_prompt("review", {"topic": "the plan"})
        resources = [str(r.uri) for r in (await c.list_resources()).resources]
        notes = await c.read_resource(NOTES_URI)
        return {"name": c.server_info.name, "tools": tools, "results": results, "prompt": prompt,
                "resources": resources, "notes": notes.contents[0].text}


def check(seen: dict, name: str, secret: str = "7731") -> None:
    assert seen["name"] == name
    assert set(seen["tools"]) == TOOLS
    assert seen["tools"]["lookup"]["properties"]["key"]["type"] == "string"
    assert seen["tools"]["add"]["required"] == ["a", "b"]
    assert seen["tools"]["sleep"]["properties"]["seconds"]["type"] == "number"
    text = {k: (r.is_error, r.content[0].text) for k, r in seen["results"].items()}
    assert text["lookup"] == (False, lookup_value("door", secret)) == (False, f"ember-secret-door-{secret}")
    assert text["add"] == (False, "42")
    assert text["sleep"] == (False, "slept")
    assert text["big"] == (False, big_text(25)) and len(big_text(25)) == 25
    assert text["fail"][0] is True and "fail" in text["fail"][1]
    (message,) = seen["prompt"].messages
    assert message.role == "user" and "the plan" in message.content.text
    assert seen["resources"] == [NOTES_URI] and seen["notes"] == NOTES_TEXT == "Buy milk. Call Ada."


def test_stdio_server_answers_the_sdk_client():
    entry = stdio_server_entry(MCP_TEST_NAME="one", MCP_TEST_SECRET="42")
    seen = anyio.run(exercise, StdioServerParameters(**entry))
    check(seen, "one", secret="42")


def test_http_server_answers_the_sdk_client():
    with http_server() as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        check(anyio.run(exercise, url), "ember-test")


def test_stdio_server_says_ready_on_stderr_and_crash_ends_the_connection():
    async def crash(errlog) -> Exception:
        async with Client(stdio_client(StdioServerParameters(**stdio_server_entry()), errlog=errlog)) as c:
            assert (await c.call_tool("add", {"a": 1, "b": 1})).content[0].text == "2"
            with pytest.raises(MCPError) as e:
                await c.call_tool("crash", {})
            return e.value

    with tempfile.TemporaryFile("w+") as errlog:
        error = anyio.run(crash, errlog)
        errlog.seek(0)
        assert READY_LINE in errlog.read()
    assert "closed" in str(error).lower()


def leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [x for sub in error.exceptions for x in leaves(sub)]
    return [error]


def test_http_crash_ends_the_connection_and_the_server():
    """Over HTTP the SDK reports the dropped connection from the client's transport (an exception
    group leaving `async with Client`), not as call_tool's result."""
    async def crash(url):
        async with Client(url) as c:
            await c.call_tool("crash", {})

    with http_server() as url:
        with pytest.raises(Exception) as e:
            anyio.run(crash, url)
        assert any("disconnected" in str(x) for x in leaves(e.value)), repr(e.value)
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert not port_answers(port)


def test_a_server_that_refuses_to_start_is_reported_with_its_output():
    with pytest.raises(RuntimeError, match=FAIL_LINE):
        with http_server(MCP_TEST_FAIL_START="1"):
            pass
