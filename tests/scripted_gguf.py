"""A tiny llama GGUF whose greedy reply is a script: a fixed chain of tokens, whatever the prompt.

Why: a reasoning model's reply must contain a `<think>` block and then an answer, which random
weights never write. The construction: one layer whose attention and MLP add nothing (zero
output projections), so the last position's hidden state is its own token's embedding. Token
i of the chain embeds as the unit vector e_i, every other token as e_K (K = the chain's length),
and the head's row for chain token i + 1 is 10 e_i (for the first, 10 e_K; for the end-of-turn
token, 10 e_{K-1}): after RMSNorm the right next token scores 80 and every other 0.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

from gguf_factory import CHATML_TEMPLATE, EOS_ID, IM_END_ID, SPECIAL_TOKENS, bpe_vocab

HIDDEN, HEADS, KV_HEADS, FFN = 64, 4, 2, 64
THINK_TOKENS = ("<think>", "</think>")  # added, user-defined tokens: the detokenizer writes them out
# The thinking model's reply, `<think>\thm</think> ok`: ĉ is "\t", Ġ " " (byte-level BPE); no "\n": it ends the prompt
THINKING_SCRIPT = ["<think>", "ĉ", "h", "m", "</think>", "Ġ", "o", "k"]
# A Qwen3-style template: ChatML, and an empty think block when thinking is switched off.
THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{{ '<|im_start|>assistant\\n' }}",
    "{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and not enable_thinking %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}")


# Qwen3-style with tools: the <tools> block and the Hermes <tool_call> syntax its template describes
THINKING_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "Call a function as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
) + THINKING_TEMPLATE

# gpt-oss's harmony markup (control tokens, as in its o200k_harmony vocabulary) and the header words
# its replies use (added here as single user-defined tokens, so a script can name them)
HARMONY_CONTROL = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>")
HARMONY_WORDS = ("assistant", "analysis", "final", "commentary", " to=functions.get_weather")
# The generation prompt of gpt-oss's template, opened into the analysis channel: the reply starts
# inside its reasoning (a script cannot repeat a token, and a whole reply names <|channel|> twice);
# the newline after it keeps the prompt's last token out of the script.
HARMONY_TEMPLATE = (
    "{% for message in messages %}{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + "
    "'<|end|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start|>assistant<|channel|>analysis<|message|>\n' }}{% endif %}")


def write_scripted_model(path: str | Path, script: list[str], template: str = THINKING_TEMPLATE,
                         harmony: bool = False, ctx: int = 512) -> Path:
    """Write the model; `script` names the reply's tokens (vocabulary entries), ending the turn after
    them. `harmony`: the vocabulary also holds gpt-oss's markup tokens and header words."""
    tokens, merges = bpe_vocab(200)
    tokens = tokens + list(THINK_TOKENS)
    n_base = len(tokens)
    if harmony:
        tokens += list(HARMONY_CONTROL) + list(HARMONY_WORDS)
    index = {t: i for i, t in enumerate(tokens)}
    chain = [index[t] for t in script]
    K, V = len(chain), len(tokens)
    assert K < HIDDEN and len(set(chain)) == K, "one unit vector per chain token"
    embed = np.zeros((V, HIDDEN), np.float32)
    embed[:, K] = 1.0
    head = np.zeros((V, HIDDEN), np.float32)
    for i, t in enumerate(chain):
        embed[t] = 0.0
        embed[t, i] = 1.0
        head[t, i - 1 if i else K] = 10.0
    head[IM_END_ID, K - 1] = 10.0

    path = Path(path)
    hd = HIDDEN // HEADS
    w = GGUFWriter(str(path), "llama")
    w.add_name("scripted-llama")
    for key, value in {"context_length": ctx, "embedding_length": HIDDEN, "block_count": 1,
                       "feed_forward_length": FFN, "attention.head_count": HEADS,
                       "attention.head_count_kv": KV_HEADS, "rope.dimension_count": hd}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    types = ([TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (n_base - len(SPECIAL_TOKENS) - 2)
             + [TokenType.USER_DEFINED] * 2)
    if harmony:
        types += [TokenType.CONTROL] * len(HARMONY_CONTROL) + [TokenType.USER_DEFINED] * len(HARMONY_WORDS)
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(EOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", embed)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(HIDDEN, np.float32))
    for name, rows in (("attn_q", HEADS * hd), ("attn_k", KV_HEADS * hd), ("attn_v", KV_HEADS * hd)):
        w.add_tensor(f"blk.0.{name}.weight", (rng.standard_normal((rows, HIDDEN)) * 0.1).astype(np.float32))
    w.add_tensor("blk.0.attn_output.weight", np.zeros((HIDDEN, HEADS * hd), np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", (rng.standard_normal((FFN, HIDDEN)) * 0.1).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", (rng.standard_normal((FFN, HIDDEN)) * 0.1).astype(np.float32))
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((HIDDEN, FFN), np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("output.weight", head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
