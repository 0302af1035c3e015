"""A tiny random SmolVLM / SmolVLM2 pair for tests: a llama LM (SmolLM2's architecture, as
SmolVLM2's LM is) whose vocabulary holds the tokens libmtmd looks up by name to wrap an idefics3
image, and tests/vlm_factory.py's idefics3 projector.

mtmd (llama-cpp-python 0.3.36's tools/mtmd/mtmd.cpp) lays an idefics3 image out as Idefics3's
processor does: each tile "<fake_token_around_image><row_R_col_C>" + its embeddings, a "\\n" after
each row but the last, then "\\n\\n<fake_token_around_image><global-img>" + the overview's
embeddings + "<fake_token_around_image>". It finds "\\n", "\\n\\n" and the two wrapper tokens by
their text among the vocabulary's tokens (so each must be one token: here "\\n\\n" is a merge,
the others control tokens) and tokenizes "<row_R_col_C>" with special parsing (control tokens too).
Random weights: the files prove the plumbing, never answer quality.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import MODEL_ARCH, MODEL_TENSOR, GGMLQuantizationType, GGUFWriter, TokenType

from arch_ggufs import _MERGES, _SPECIALS, TINY, _byte_tokens, _Tensors
from vlm_factory import TinyVlm, _close, write_mmproj

# SmolVLM2's chat template (its chat_template.json): it reads a message's content only as typed parts.
SMOLVLM2_TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
                     "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
                     "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
                     "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
                     "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
SMOLVLM_GRID = 4  # <row_R_col_C> tokens up to this many rows and columns of tiles
SMOLVLM_SPECIALS = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>",
                    *(f"<row_{r}_col_{c}>" for r in range(1, SMOLVLM_GRID + 1) for c in range(1, SMOLVLM_GRID + 1)))


def _smolvlm_tokenizer(w: GGUFWriter, chat_template: str | None) -> int:
    """arch_ggufs' byte BPE and ChatML specials, a "\\n\\n" merge and SmolVLM's image tokens; the size."""
    merges = (*_MERGES, "Ċ Ċ")  # "\\n\\n" is one token, as mtmd's overview start wants
    tokens = _byte_tokens() + [m.replace(" ", "") for m in merges]
    normal = len(tokens)
    tokens += [*_SPECIALS, *SMOLVLM_SPECIALS]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * normal + [TokenType.CONTROL] * (len(tokens) - normal))
    w.add_token_merges(list(merges))
    w.add_bos_token_id(normal)
    w.add_eos_token_id(normal)
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    return len(tokens)


def write_smolvlm_lm(path: Path, *, seed: int = 0, qtype: GGMLQuantizationType | None = None,
                     chat_template: str | None = None) -> Path:
    """A tiny random SmolVLM / SmolVLM2 LM: llama's layers (SmolLM2's), a vocabulary with the image tokens."""
    rng, d = np.random.default_rng(seed), TINY
    w = GGUFWriter(str(path), "llama")
    t, T = _Tensors(w, MODEL_ARCH.LLAMA, rng, 0.0, qtype), MODEL_TENSOR
    w.add_name("tiny-smolvlm")
    for add, value in ((w.add_context_length, 8192), (w.add_embedding_length, d.embd), (w.add_block_count, 2),
                       (w.add_feed_forward_length, d.ff), (w.add_head_count, d.heads),
                       (w.add_head_count_kv, d.kv_heads), (w.add_rope_freq_base, 100000.0),
                       (w.add_layer_norm_rms_eps, 1e-5)):
        add(value)
    w.add_file_type(0 if qtype is None else 7)
    vocab = _smolvlm_tokenizer(w, chat_template)
    t.add(T.TOKEN_EMBD, (vocab, d.embd))
    for i in range(2):
        t.add(T.ATTN_NORM, (d.embd,), bid=i, fill=1.0)
        t.add(T.ATTN_Q, (d.heads * d.head_dim, d.embd), bid=i)
        t.add(T.ATTN_K, (d.kv_heads * d.head_dim, d.embd), bid=i)
        t.add(T.ATTN_V, (d.kv_heads * d.head_dim, d.embd), bid=i)
        t.add(T.ATTN_OUT, (d.embd, d.heads * d.head_dim), bid=i)
        t.add(T.FFN_NORM, (d.embd,), bid=i, fill=1.0)
        t.add(T.FFN_GATE, (d.ff, d.embd), bid=i)
        t.add(T.FFN_UP, (d.ff, d.embd), bid=i)
        t.add(T.FFN_DOWN, (d.embd, d.ff), bid=i)
    t.add(T.OUTPUT_NORM, (d.embd,), fill=1.0)
    t.add(T.OUTPUT, (vocab, d.embd))
    _close(w)
    return path


def write_tiny_smolvlm(folder: Path, *, seed: int = 0, qtype: GGMLQuantizationType | None = None,
                       chat_template: str | None = None) -> TinyVlm:
    """lm.gguf (llama, SmolVLM's image tokens) and mmproj.gguf (idefics3) in `folder`. mtmd resizes
    an image to 64 px on its longest side, cuts it into 32 px tiles (rows x cols) and adds the whole
    image as an overview tile; each tile is 4 x 4 patches shuffled 2 x 2 into 4 tokens. So
    random_pixels' default 48 x 40 image is 2 x 2 tiles and the overview: 5 chunks, 20 tokens."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = write_smolvlm_lm(folder / "lm.gguf", seed=seed, qtype=qtype, chat_template=chat_template)
    proj = write_mmproj(folder / "mmproj.gguf", image=32, preproc=64, seed=seed + 1, projector_type="idefics3")
    return TinyVlm(model, proj, 32, 20)
