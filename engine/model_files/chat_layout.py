"""Whether a model file can chat: it has a chat template of its own, or ChatML's tokens, which Ember
lays a chat out with (engine/loaders/chat_template.py falls back to ChatML for them). A file with
neither is a base model, for text completion: its chats fall back to plain `Role: text` lines,
which it tends to continue rather than answer. Read from the metadata alone, torch-free, so the
GUI marks such a model before it is loaded."""
from __future__ import annotations

from pathlib import Path

from engine.model_files.gguf_file import GGUFFile
from engine.model_files.meta import read_json

CHATML_START = "<|im_start|>"


def completion_only(path: str | Path) -> bool:
    """No chat template and no ChatML tokens in a GGUF file or a Hugging Face folder."""
    path = Path(path)
    if path.is_dir():  # chat_template.jinja, or tokenizer_config.json's chat_template (a string or a list)
        config = read_json(path / "tokenizer_config.json", required=False) or {}
        tokenizer = path / "tokenizer.json"
        return not ((path / "chat_template.jinja").is_file() or config.get("chat_template")
                    or (tokenizer.is_file() and f'"{CHATML_START}"' in tokenizer.read_text(errors="replace")))
    with GGUFFile(path) as f:
        template = f.get("tokenizer.chat_template")
        return not (isinstance(template, str) and template.strip()) and \
            CHATML_START not in (f.get("tokenizer.ggml.tokens") or [])
