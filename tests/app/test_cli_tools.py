"""The CLI with MCP tools (issue 64): `ember generate --mcp F`, `ember chat --mcp F` and `ember mcp list`,
run as a user runs them (`python -m app ...`, a real engine child process) against the real MCP test
server (tests/mcp_test_server.py, stdio and Streamable HTTP) and a tiny GGUF whose greedy reply is a
scripted tool call, then an answer once the prompt ends with the tool's result. The approval prompt is
answered on a real pseudo-terminal."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.agent.loop import StepLimitReached
from app.agent.steps import Approval, CallStatus, ToolStep
from app.cli_tool_view import TerminalView, shorten
from mcp_test_server import lookup_value
from mcp_util import http_server, stdio_server_entry
from scripted_gguf import write_tool_model

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is stored under door?"
ANSWER = "The door value is ember-secret-door-7731."  # what the model says after the tool's result


def ember(*argv: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBER_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "app", *argv], input=stdin or "", capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=240)


def write_mcp(path: Path, **servers: dict) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def lookup_model(tmp_path_factory) -> Path:
    return write_tool_model(tmp_path_factory.mktemp("tool") / "lookup.gguf",
                            {"name": "lookup", "arguments": {"key": "door"}}, answer=ANSWER)


def test_generate_with_yes_prints_the_call_its_result_and_the_answer(tmp_path, lookup_model):
    mcp = write_mcp(tmp_path / "mcp.json", kit=stdio_server_entry())
    out = ember("generate", "--mcp", str(mcp), "--yes", "--model", str(lookup_model), "--backend", "torch",
                QUESTION, home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ANSWER  # the answer alone on stdout; calls and results on stderr
    assert "MCP server kit (stdio: " in out.stderr and "ready, 6 tools" in out.stderr
    assert 'tool call: lookup on kit {"key": "door"}' in out.stderr
    result = next(line for line in out.stderr.splitlines() if line.startswith("  result ("))
    assert result.endswith(f": {lookup_value('door')}")  # the server got key=door and answered
    assert "Traceback" not in out.stderr and "Allow once" not in out.stderr


def test_off_a_terminal_without_yes_the_call_is_denied_and_says_to_pass_yes(tmp_path, lookup_model):
    mcp = write_mcp(tmp_path / "mcp.json", kit=stdio_server_entry())
    out = ember("generate", "--mcp", str(mcp), "--model", str(lookup_model), "--backend", "torch", QUESTION,
                home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert 'tool call: lookup on kit {"key": "door"}' in out.stderr
    assert "pass --yes to allow tool calls" in out.stderr
    assert "  denied: The user denied this tool call." in out.stderr
    assert lookup_value("door") not in out.stderr  # the server was never called
    assert out.stdout.strip() == ANSWER  # the refusal went back to the model, which answered


def test_chat_keeps_the_calls_in_its_history_and_auto_approve_allows_without_asking(tmp_path, lookup_model):
    entry = {**stdio_server_entry(), "autoApprove": ["lookup"]}
    mcp = write_mcp(tmp_path / "mcp.json", kit=entry)
    out = ember("chat", "--mcp", str(mcp), "--model", str(lookup_model), "--backend", "torch",
                home=tmp_path / "home", stdin=f"{QUESTION}\nAnd again?\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(ANSWER) == 2  # two turns, the second over the first's calls and results
    assert out.stderr.count("result (") == 2 and lookup_value("door") in out.stderr
    assert "pass --yes" not in out.stderr and "Traceback" not in out.stderr


def test_a_call_past_the_tool_timeout_is_cancelled(tmp_path):
    model = write_tool_model(tmp_path / "sleep.gguf", {"name": "sleep", "arguments": {"seconds": 60}},
                             answer="It slept too long.")
    mcp = write_mcp(tmp_path / "mcp.json", kit=stdio_server_entry())
    out = ember("generate", "--mcp", str(mcp), "--yes", "--tool-timeout", "0.5", "--model", str(model),
                "--backend", "torch", "Sleep.", home=tmp_path / "home")
    assert out.returncode == 0, out.stderr
    assert "  timeout (" in out.stderr and "sleep took longer than 0.5 s and was cancelled" in out.stderr
    assert out.stdout.strip() == "It slept too long."


def test_mcp_list_shows_ready_servers_with_their_tools_and_a_failed_one_with_its_reason(tmp_path):
    with http_server() as url:
        mcp = write_mcp(tmp_path / "mcp.json", kit=stdio_server_entry(),
                        web={"url": url}, broken={"command": str(tmp_path / "no-such-server")},
                        off={**stdio_server_entry(), "disabled": True})
        out = ember("mcp", "list", "--mcp", str(mcp), home=tmp_path / "home")
    assert out.returncode == 1, out.stderr  # a server failed
    lines = out.stdout.splitlines()
    assert lines[0] == f"MCP servers in {mcp}:"
    assert any(ln.startswith("kit (stdio: ") and ln.endswith("ready, 6 tools") for ln in lines)
    assert f"web (http: {url}): ready, 6 tools" in lines
    assert f"broken (stdio: {tmp_path / 'no-such-server'}): failed: command not found" in out.stdout
    assert any(ln.startswith("off (stdio: ") and ln.endswith(": disabled") for ln in lines)
    assert lines.count("  lookup: Look up the value stored under a key.") == 2
    assert "  add: Add two integers." in lines and "Traceback" not in out.stderr


def test_mcp_list_reads_the_file_next_to_the_settings(tmp_path):
    home = tmp_path / "home"
    out = ember("mcp", "list", home=home)
    assert out.returncode == 0 and out.stdout.startswith("No MCP servers in ") and "does not exist" in out.stdout
    write_mcp(home / "config" / "mcp.json", kit={**stdio_server_entry(), "autoApprove": ["add"]})
    out = ember("mcp", "list", home=home)
    assert out.returncode == 0, out.stderr
    assert f"MCP servers in {home / 'config' / 'mcp.json'}:" in out.stdout
    assert "  add [always allowed]: Add two integers." in out.stdout


def test_errors_are_words_not_tracebacks(tmp_path, lookup_model):
    broken = tmp_path / "broken.json"
    broken.write_text("{\"mcpServers\": {", encoding="utf-8")
    bad_entry = write_mcp(tmp_path / "bad.json", x={"command": "a", "url": "http://b"})
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_text("not a model", encoding="utf-8")
    ok = write_mcp(tmp_path / "mcp.json", kit=stdio_server_entry())
    cases = [(["mcp", "list", "--mcp", str(broken)], f"error: {broken} is not valid JSON"),
             (["generate", "--mcp", str(tmp_path / "none.json"), "x"], "none.json: no such file"),
             (["mcp", "list", "--mcp", str(bad_entry)], "server 'x': give either a \"command\""),
             (["generate", "--mcp", str(ok), "--yes", "--model", str(not_a_model), "x"],
              "error: the engine did not start"),
             (["generate", "--mcp", str(ok), "--raw", "--model", str(lookup_model), "x"], "leave out --raw")]
    for argv, words in cases:
        out = ember(*argv, home=tmp_path / "home")
        assert out.returncode != 0 and words in out.stderr, (argv, out.stderr)
        assert "Traceback" not in out.stderr, (argv, out.stderr)


def test_the_approval_prompt_on_a_terminal(tmp_path):
    """y, a, n and Ctrl-D, typed on a real pseudo-terminal."""
    master, slave = os.openpty()
    step = ToolStep("call_1", "lookup", '{"key": "door"}', server="kit", tool="lookup")
    err = io.StringIO()
    with os.fdopen(slave, "r", closefd=True) as tty_in:
        view = TerminalView(out=io.StringIO(), err=err, stdin=tty_in)
        os.write(master, b"maybe\ny\na\nn\n")
        answers = [view.approve(step, None) for _ in range(3)]
        os.write(master, b"\x04")  # Ctrl-D: the end of input is a denial
        answers.append(view.approve(step, None))
    assert answers == [Approval.ONCE, Approval.ALWAYS, Approval.DENY, Approval.DENY]
    assert err.getvalue().count('tool call: lookup on kit {"key": "door"}') == 1
    assert err.getvalue().count("Allow once [y] / Always for this tool [a] / Deny [n]: ") == 5  # "maybe" asks again


def test_long_results_are_shortened_and_failures_say_their_status():
    err = io.StringIO()
    view = TerminalView(out=io.StringIO(), err=err)
    view.show_result(ToolStep("c1", "big", '{"n": 5000}', server="kit", tool="big", status=CallStatus.OK,
                              result="7" * 5000, seconds=0.1))
    view.show_result(ToolStep("c2", "nope", "{}", status=CallStatus.UNAVAILABLE,
                              result="error: there is no tool named 'nope'"))
    view.show_result(ToolStep("c3", "big", '{"n": 5000}', server="kit", tool="big", status=CallStatus.OK,
                              result="7", seconds=0.0, extra={"repeat_of": "c1"}))
    view.show(StepLimitReached(10))
    text = err.getvalue()
    assert "  result (a repeat: not run again): 7\n" in text
    assert "(10 rounds of tool calls, the --max-steps limit: now an answer without tools)" in text
    assert "  result (0.10 s): " + "7" * 600 + " ... (5,000 characters in all)" in text
    assert "tool call: nope {}\n  unavailable: error: there is no tool named 'nope'" in text
    assert shorten("a\n" * 20).count("\n") == 11 and shorten("short") == "short"
