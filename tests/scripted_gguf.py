"""A tiny llama GGUF whose greedy reply is a script: a fixed chain of tokens, whatever the prompt.

Why: a reasoning model's reply must contain a `<think>` block and then an answer, which random
weights never write. The construction: one layer whose attention and MLP add nothing (zero
output projections), so the last position's hidden state is its own token's embedding. Token
i of the chain embeds as the unit vector e_i, every other token as e_K (K = the chain's length),
and the head's row for chain token i + 1 is 10 e_i (for the first, 10 e_K; for the end-of-turn
token, 10 e_{K-1}): after RMSNorm the right next token scores 80 and every other 0.

Since the reply depends only on the prompt's last token, a model can follow one of several chains:
`script_weights` gives each chain its own "start" direction, chosen by the last token. The tool
model (`write_tool_model`) uses two: a Hermes/Qwen2.5 tool call, and a plain answer that its
template selects by ending the generation prompt in ANSWER_MARKER when the last message is a tool
result, so an agent loop ends. Multi-character pieces (a whole call, the answer) are added tokens.
"""
from __future__ import annotations

import json
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
    types = ([TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS) - 2)
             + [TokenType.USER_DEFINED] * 2)
    if harmony:
        tokens += list(HARMONY_CONTROL) + list(HARMONY_WORDS)
        types += [TokenType.CONTROL] * len(HARMONY_CONTROL) + [TokenType.USER_DEFINED] * len(HARMONY_WORDS)
    index = {t: i for i, t in enumerate(tokens)}
    embed, head = script_weights(len(tokens), [[index[t] for t in script]], {})
    return write_llama(path, tokens, types, merges, template, embed, head, ctx)


def script_weights(vocab_size: int, chains: list[list[int]], starts: dict[int, int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(token_embd, output) for greedy replies that follow `chains` (token ids): a prompt whose last
    token is `t` in `starts` gets chain starts[t], any other prompt chain 0; each ends the turn.
    The construction of the module docstring, with one "start" direction per chain after the
    chains' own unit vectors."""
    flat = [t for chain in chains for t in chain]
    first_start = len(flat)
    assert first_start + len(chains) <= HIDDEN and len(set(flat)) == len(flat), "one unit vector per chain token"
    assert not set(starts) & set(flat) and IM_END_ID not in flat, "a chain token cannot start a chain"
    embed = np.zeros((vocab_size, HIDDEN), np.float32)
    embed[:, first_start] = 1.0
    for t, j in starts.items():
        embed[t] = 0.0
        embed[t, first_start + j] = 1.0
    head = np.zeros((vocab_size, HIDDEN), np.float32)
    dim = 0
    for j, chain in enumerate(chains):
        for i, t in enumerate(chain):
            embed[t] = 0.0
            embed[t, dim + i] = 1.0
            head[t, dim + i - 1 if i else first_start + j] = 10.0
        dim += len(chain)
        head[IM_END_ID, dim - 1] = 10.0
    return embed, head


def write_llama(path: str | Path, tokens: list[str], types: list[TokenType], merges: list[str], template: str,
                embed: np.ndarray, head: np.ndarray, ctx: int) -> Path:
    """One llama layer that adds nothing (zero output projections) around `embed` and `head`."""
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


# ---- a tool-calling model ----------------------------------------------------------------------
# The marker that ends the generation prompt after a tool result (a control token: parsed in the
# prompt, never written out); it starts the answer, any other last token starts the call.
ANSWER_MARKER = "<|tool_answer|>"
TOOL_ANSWER = "The tool answered."
# Qwen2.5's template (tools in the system block, calls as Hermes <tool_call> blocks, results as
# <tool_response> blocks in a user turn), its generation prompt ending in ANSWER_MARKER after a tool.
TOOL_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
{%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if messages[-1].role == 'tool' %}{{- '<|tool_answer|>' }}{%- endif %}
{%- endif %}"""


def tool_call_text(call: dict) -> str:
    """One call as Hermes / Qwen2.5 write it; `call` is {"name", "arguments": {...}}."""
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def write_tool_model(path: str | Path, call: dict | list[dict] | None, answer: str = TOOL_ANSWER,
                     template: str = TOOL_TEMPLATE, ctx: int = 4096) -> Path:
    """Write a model whose greedy reply is `call` as a Hermes tool call (several calls: one after
    another, a newline between), and `answer` when the prompt ends with a tool result (the
    template's ANSWER_MARKER); with `call` None it always answers. Each call and the answer are one
    added token apiece, so a reply is a few tokens and each is unique."""
    calls = [] if call is None else [call] if isinstance(call, dict) else list(call)
    call_pieces = [tool_call_text(c) + ("\n" if i < len(calls) - 1 else "") for i, c in enumerate(calls)]
    tokens, merges = bpe_vocab(200)
    types = [TokenType.CONTROL] * len(SPECIAL_TOKENS) + [TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    added = [ANSWER_MARKER, *call_pieces, answer]
    assert len(set(added)) == len(added) and not set(added) & set(tokens), "the reply's pieces must be new tokens"
    tokens = tokens + added
    types += [TokenType.CONTROL] + [TokenType.USER_DEFINED] * (len(added) - 1)
    index = {t: i for i, t in enumerate(tokens)}
    answer_chain = [index[answer]]
    chains = [[index[p] for p in call_pieces], answer_chain] if calls else [answer_chain]
    embed, head = script_weights(len(tokens), chains, {index[ANSWER_MARKER]: len(chains) - 1})
    return write_llama(path, tokens, types, merges, template, embed, head, ctx)
