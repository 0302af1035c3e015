"""`ember chat` (streaming terminal chat with history) and `ember generate PROMPT`.

These run the engine in-process: no server, no GUI.
"""
from __future__ import annotations

import argparse
import sys


def add_engine_args(p: argparse.ArgumentParser) -> None:
    from engine.backends.cli_args import add_backend_args

    p.add_argument("--model", "-m", help="path of a GGUF file (default: the bundled SmolLM2-135M-Instruct)")
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


def build_engine(args):
    """The engine on the backend, device and dtype that `engine.backends` decides (and logs)."""
    from engine.backends import BackendError, load_engine
    from engine.config import EngineConfig
    from engine.model_files.bundled import default_model_path

    path = args.model or str(default_model_path())
    config = EngineConfig(model_path=path, dtype=args.dtype, weights=args.weights, num_threads=args.threads,
                          max_model_len=args.ctx)
    try:
        return load_engine(config, args.backend, args.device)[0]
    except BackendError as e:
        raise SystemExit(f"error: {e}") from None


def sampling_params(args):
    from engine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repeat_penalty, frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty, seed=args.seed, max_tokens=args.max_tokens,
        stop=list(args.stop))


def stream(engine, prompt, params, out=sys.stdout) -> str:
    """Print the reply as it is generated; returns the whole text."""
    rid = engine.add_request(prompt, params)
    text = ""
    while engine.has_unfinished():
        for o in engine.step():
            if o.request_id == rid:
                out.write(o.new_text)
                out.flush()
                text = o.text
    return text


def run_generate(args) -> int:
    engine = build_engine(args)
    prompt = args.prompt
    if args.chat:
        prompt = engine.chat_template.render([{"role": "user", "content": prompt}])
    stream(engine, prompt, sampling_params(args))
    print()
    return 0


def run_chat(args) -> int:
    engine = build_engine(args)
    params = sampling_params(args)
    history: list[dict] = [{"role": "system", "content": args.system}] if args.system else []
    print("Ember chat. Empty line or Ctrl-D quits; /reset clears the history.", file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line:
            return 0
        if line == "/reset":
            del history[1 if args.system else 0:]
            continue
        history.append({"role": "user", "content": line})
        prompt = engine.chat_template.render(history, add_generation_prompt=True)
        try:
            reply = stream(engine, prompt, params)
        except ValueError as e:  # e.g. the history outgrew the context
            print(f"\nerror: {e}", file=sys.stderr)
            history.pop()
            continue
        print()
        history.append({"role": "assistant", "content": reply})


def register(sub) -> None:
    p = sub.add_parser("chat", help="chat in the terminal (streaming, keeps the history)")
    add_engine_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.set_defaults(func=run_chat)

    g = sub.add_parser("generate", help="complete one prompt and print the text as it streams")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_engine_args(g)
    add_sampling_args(g, temperature=0.0)
    g.set_defaults(func=run_generate)
