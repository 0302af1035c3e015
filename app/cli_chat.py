"""`ember chat` (streaming terminal chat with history) and `ember generate PROMPT`.

These run the engine in-process: no server, no GUI; `chat --docs COLLECTION` answers from documents
(app/cli_chat_docs.py). With `--mcp FILE` (tools) they run it in an engine process instead, driven by
the agent loop (app/cli_tools.py).
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from app.cli_chat_docs import add_docs_args, open_docs_chat
from app.cli_model import installed_load_settings, installed_mmproj, installed_template, resolve_model


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from engine.backends.cli_args import add_backend_args

    p.add_argument("--model", "-m", help="an installed model's id (see `ember models list`) or the path of a "
                                         "GGUF file (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--threads", "-t", type=int, default=None, help="CPU threads (default: torch's)")
    add_backend_args(p)
    p.add_argument("--ctx", type=int, default=None, help="context length (default: the model's, at most 4096)")


def add_sampling_args(p: argparse.ArgumentParser, temperature: float = 0.7) -> None:
    p.add_argument("--temperature", "--temp", type=float, default=temperature, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="same seed, same text")
    p.add_argument("--max-tokens", "-n", type=int, default=512)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="go on past the end-of-text token (as llama.cpp's)")


def build_engine(args):
    """The engine on the backend, device and dtype that `engine.backends` decides (and logs)."""
    from engine.backends import BackendError, load_engine
    from engine.loaders.chat_template import TemplateError
    from engine.model_files.fit import UnsupportedArchitecture
    from engine.config import EngineConfig

    path = resolve_model(args.model)
    load = installed_load_settings(args.model)  # the model manager's Load settings…; flags win
    config = EngineConfig(model_path=path, dtype=args.dtype, weights=args.weights, kv_cache_dtype=args.kv_cache_dtype,
                          num_threads=args.threads or load.threads, speculative=args.speculative,
                          max_model_len=args.ctx or load.context_length,
                          chat_template=args.chat_template or installed_template(args.model),
                          mmproj=args.mmproj or installed_mmproj(args.model))
    try:
        engine = load_engine(config, args.backend, args.device if args.device != "auto" else load.device or "auto")[0]
        if not engine.runner.generates:
            engine.close()
            print(f"error: {path} is an embedding model ({engine.runner.architecture}): it makes embeddings, "
                  "not text; serve it (`ember serve --model FILE`) and ask /v1/embeddings", file=sys.stderr)
            raise SystemExit(2)
        return engine
    except UnsupportedArchitecture as e:  # a file no runner runs: exit 2, as for a bad argument
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except (BackendError, TemplateError) as e:
        raise SystemExit(f"error: {e}") from None


def sampling_params(args):
    from engine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repeat_penalty, frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty, seed=args.seed, max_tokens=args.max_tokens,
        stop=list(args.stop), ignore_eos=args.ignore_eos)


DIM, PLAIN = "\033[2m", "\033[0m"


def stream(engine, prompt, params, out=None, thinking=None) -> str:
    """Print the reply as it is generated; returns the whole text (with a reasoning parser
    `thinking`, the answer alone: the thoughts print dimmed, or after "Thinking: " off a terminal).

    Ctrl-C stops the reply, not the program: between two engine steps (never inside one, which would
    leave the engine half-updated) the request is aborted, its KV freed, and the text so far returned.
    """
    out = out or sys.stdout  # looked up now: a default bound at import would keep a replaced stream
    shown = {"thought": False, "answer": ""}
    tty = getattr(out, "isatty", lambda: False)()

    def write(delta: str, last: bool = False) -> None:
        if thinking is None:
            out.write(delta)
            shown["answer"] += delta
            return
        thought, answer = thinking.feed(delta)
        if last:
            more = thinking.finish()
            thought, answer = thought + more[0], answer + more[1]
        if thought:
            if not shown["thought"]:
                out.write(DIM if tty else "Thinking: ")
            shown["thought"] = True
            out.write(thought)
        if answer:
            if shown["thought"] and not shown["answer"]:
                out.write(PLAIN + "\n\n" if tty else "\n\n")
            shown["answer"] += answer
            out.write(answer)

    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    rid = engine.add_request(prompt, params)
    try:
        while engine.has_unfinished():
            if stop.is_set():
                engine.abort(rid)
                while engine.has_unfinished():  # the abort's final output; nothing more is generated
                    engine.step()
                out.write(" [stopped]")
                break
            for o in engine.step():
                if o.request_id == rid:
                    write(o.new_text, last=o.finished)
                    out.flush()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if tty and shown["thought"] and not shown["answer"]:
            out.write(PLAIN)  # stopped while thinking: the terminal's colour back
    out.flush()
    return shown["answer"]


def run_generate(args) -> int:
    if args.mcp:  # tools: the model runs in an engine process, the agent loop drives it
        from app.cli_tools import run_generate_tools

        return run_generate_tools(args)
    engine = build_engine(args)
    prompt, params, thinking = args.prompt, sampling_params(args), None
    if not args.raw and engine.chat_template is not None:
        prompt = engine.chat_template.render([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             **think_switch(args))
        params.stop += engine.chat_template.turn_stops
        thinking = reasoning_parser(engine, prompt)
    stream(engine, prompt, params, thinking=thinking)
    print()
    return 0


def run_chat(args) -> int:
    if args.mcp and args.docs:
        raise SystemExit("error: --docs and --mcp do not go together yet")
    if args.mcp:
        from app.cli_tools import tool_chat

        try:
            with tool_chat(args) as reply:
                return chat_loop(args, reply)
        except KeyboardInterrupt:  # while the engine or the servers start
            print("\nstopped", file=sys.stderr)
            return 130
    docs = open_docs_chat(args) if args.docs else None  # the collection first: its errors cost no model load
    engine = build_engine(args)
    params = sampling_params(args)
    params.stop += engine.chat_template.turn_stops

    def reply(history: list[dict]) -> str:
        turn, hits = docs.turn(history) if docs else (history, [])
        prompt = engine.chat_template.render(turn, add_generation_prompt=True, **think_switch(args))
        text = stream(engine, prompt, params, thinking=reasoning_parser(engine, prompt))
        print()
        if docs:
            docs.print_sources(text, hits)
        return text

    try:
        return chat_loop(args, reply)
    finally:
        if docs:
            docs.close()


def chat_loop(args, reply) -> int:
    """Read a line, answer it with `reply(history)` (which prints the answer and returns its text), keep both."""
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    print("Ember chat. Ctrl-C stops a reply; an empty line or Ctrl-D quits; /reset clears the history.",
          file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:  # at the prompt, as in Python's REPL: a fresh line, the chat stays
            print("\n(Ctrl-D or an empty line quits)", file=sys.stderr)
            continue
        if not line:
            return 0
        if line == "/reset":
            del history[1 if args.system else 0:]
            continue
        turn = len(history)
        history.append({"role": "user", "content": line})
        try:
            text = reply(history)  # with tools, the calls and their results join the history too
        except ValueError as e:  # e.g. the history outgrew the context
            print(f"\nerror: {e}", file=sys.stderr)
            del history[turn:]
            continue
        history.append({"role": "assistant", "content": text})


def think_switch(args) -> dict:
    """--think / --no-think as the template variable Qwen3 and SmolLM3 read (nothing: the model's default)."""
    return {} if args.think is None else {"enable_thinking": args.think}


def reasoning_parser(engine, prompt: str):
    """A parser for the reply's <think> block when the model's template has one, else None."""
    from engine.server.reasoning import ReasoningFormat, ReasoningParser, reasoning_format

    fmt, inside = reasoning_format(engine.chat_template, prompt)
    return None if fmt is ReasoningFormat.NONE else ReasoningParser(fmt, inside)


def _add_think_flags(p) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--think", dest="think", action="store_true", default=None,
                   help="a reasoning model thinks before it answers (its template's enable_thinking)")
    g.add_argument("--no-think", dest="think", action="store_false", help="a reasoning model answers at once")


def register(sub) -> None:
    from app.cli_tools import add_tool_args

    p = sub.add_parser("chat", help="chat in the terminal (streaming, keeps the history)")
    add_engine_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    _add_think_flags(p)
    add_tool_args(p)
    add_docs_args(p)
    p.set_defaults(func=run_chat)

    g = sub.add_parser("generate", help="complete one prompt and print the text as it streams")
    g.add_argument("prompt")
    g.add_argument("--raw", action="store_true",
                   help="complete the prompt as plain text (default: wrap it in the model's chat template)")
    g.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    add_engine_args(g)
    add_sampling_args(g, temperature=0.0)
    _add_think_flags(g)
    add_tool_args(g)
    g.set_defaults(func=run_generate)
