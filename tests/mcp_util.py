"""Start the test MCP server (tests/mcp_test_server.py) the two ways users configure servers: a
stdio entry in Claude Desktop's notation, and a Streamable HTTP server on a loopback port."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.bench.lib.processes import free_port

SERVER_SCRIPT = Path(__file__).resolve().parent / "mcp_test_server.py"


def stdio_server_entry(**env: str) -> dict:
    """One `mcpServers` entry (Claude Desktop / Cursor notation) that runs the test server over
    stdio; `env` goes to its environment (MCP_TEST_NAME, MCP_TEST_SECRET, MCP_TEST_FAIL_START)."""
    return {"command": sys.executable, "args": [str(SERVER_SCRIPT), "stdio"], "env": dict(env)}


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextmanager
def http_server(timeout: float = 60.0, **env: str) -> Iterator[str]:
    """The test server over Streamable HTTP on a free loopback port: yields its URL
    (http://127.0.0.1:PORT/mcp) once the port answers, and kills the process on exit. `env` as
    for stdio_server_entry. Its output goes to a file that a failed start quotes."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, str(SERVER_SCRIPT), "http", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            deadline = time.monotonic() + timeout
            while not port_answers(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    why = f"exited with {proc.returncode}" if proc.returncode is not None else f"silent for {timeout} s"
                    raise RuntimeError(f"the MCP test server {why}; its output:\n{log.read()}")
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.kill()
            proc.wait()
