"""A real MCP server for the tests, written with the official SDK (`mcp.server.mcpserver.MCPServer`).

Run it as `python tests/mcp_test_server.py stdio` or `python tests/mcp_test_server.py http PORT`
(Streamable HTTP on 127.0.0.1:PORT, path /mcp); tests/mcp_util.py starts it both ways.

Tools: `lookup(key)` returns a value no model can know (`lookup_value`), `add(a, b)`, `sleep(seconds)`
(for timeouts), `crash()` (the process dies at once), `big(n)` (n characters, for oversized results),
`fail()` (raises: the SDK answers with an isError result). One prompt, `review(topic)`, and one
resource, `notes://today`. At start it writes READY_LINE to stderr (the app's log must show it).

Environment: MCP_TEST_NAME names the server (two instances told apart; both publish `lookup`, so
their names collide), MCP_TEST_SECRET changes lookup's suffix (which instance answered),
MCP_TEST_FAIL_START=1 makes it write FAIL_LINE to stderr and exit 2 before serving (a server that
never starts).
"""
from __future__ import annotations

import os
import sys

import anyio

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

READY_LINE = "mcp test server ready"
FAIL_LINE = "mcp test server refuses to start"
DEFAULT_NAME = "ember-test"
DEFAULT_SECRET = "7731"
NOTES_URI = "notes://today"
NOTES_TEXT = "Buy milk. Call Ada."
DIGITS = "0123456789"


def lookup_value(key: str, secret: str = DEFAULT_SECRET) -> str:
    """What `lookup(key)` answers: a made-up value a model cannot guess."""
    return f"ember-secret-{key}-{secret}"


def big_text(n: int) -> str:
    """What `big(n)` answers: the digits 0-9 over and over, n characters (a cut shows where)."""
    return (DIGITS * (n // len(DIGITS) + 1))[:n]


def build_server(name: str = DEFAULT_NAME, secret: str = DEFAULT_SECRET) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool()
    def lookup(key: str) -> str:
        """Look up the value stored under a key."""
        return lookup_value(key, secret)

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Wait for some seconds, then answer "slept"."""
        await anyio.sleep(seconds)
        return "slept"

    @server.tool()
    def crash() -> str:
        """End the server process at once."""
        os._exit(3)

    @server.tool()
    def big(n: int) -> str:
        """Answer with a text of n characters."""
        return big_text(n)

    @server.tool()
    def fail() -> str:
        """Always fail."""
        raise ToolError("the fail tool failed, as it always does")

    @server.prompt()
    def review(topic: str) -> str:
        """Ask for a review of a topic."""
        return f"Please review {topic}: what is good, what is wrong, what to change."

    @server.resource(NOTES_URI, name="today", mime_type="text/plain")
    def notes() -> str:
        return NOTES_TEXT

    return server


def main(argv: list[str]) -> None:
    if os.environ.get("MCP_TEST_FAIL_START") == "1":
        print(FAIL_LINE, file=sys.stderr, flush=True)
        sys.exit(2)
    server = build_server(os.environ.get("MCP_TEST_NAME", DEFAULT_NAME),
                          os.environ.get("MCP_TEST_SECRET", DEFAULT_SECRET))
    print(READY_LINE, file=sys.stderr, flush=True)
    if argv[:1] == ["stdio"]:
        server.run("stdio")
    elif argv[:1] == ["http"] and len(argv) == 2:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]), streamable_http_path="/mcp")
    else:
        sys.exit("usage: mcp_test_server.py stdio | http PORT")


if __name__ == "__main__":
    main(sys.argv[1:])
