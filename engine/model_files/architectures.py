"""The model architectures each runner of Ember runs, as data: GGUF `general.architecture` names.

The GUI's import and fit checks must say whether a model file will run *before* loading it, and
the GUI's process never imports llama_cpp (nor torch): so what the vendored llama.cpp can load is
written down here rather than asked of the library. Standard library only.

LLAMA_CPP_ARCHITECTURES is the LLM_ARCH_NAMES table of vendor/llama.cpp/src/llama-arch.cpp in
the llama-cpp-python sdist the Makefile pins (llama-cpp-python==0.3.36: 154 names), less the
names that are not a text-generating model llama-cpp-python or llama-server can run (listed
below with the reason). When the pin moves, update this list from the new sdist's table:
  pip download --no-deps --no-binary :all: llama-cpp-python==X.Y.Z
  then read llama_cpp_python-X.Y.Z/vendor/llama.cpp/src/llama-arch.cpp (LLM_ARCH_NAMES) and the
  llama_model_mapping switch in llama-model.cpp (names without a model class do not load).
"""
from __future__ import annotations

from engine.model_files.families import FAMILIES

# Ember's own (torch) engine: the dense families of engine/model_files/families.py.
EMBER_ARCHITECTURES: frozenset[str] = frozenset(FAMILIES)

# llama-cpp-python 0.3.36's llama.cpp, in its table's order. Left out of its 154 names:
# - "(unknown)": the sentinel for a name the table lacks; "clip": a stub that lets llama-quantize
#   open mmproj files (its hparams, tensors and graph abort); "gptj": named in the table but
#   llama_model_mapping has no model for it ("unsupported model architecture").
# - encoders that make embeddings, not text: EMBEDDING_ARCHITECTURES below (they load as
#   embedding models), and "llama-embed" and "t5encoder" (no decoder), which do not.
# - "t5": encoder-decoder; neither llama-cpp-python's Llama nor llama-server calls llama_encode.
# - audio: "wavtokenizer-dec" (a codec's decoder), "qwen3tts", "pockettts" (speech).
# - speculative-decoding heads that read a target model's hidden states, not models on their
#   own: "eagle3", "dflash", "gemma4-assistant".
# - diffusion language models ("dream", "llada", "llada-moe", "rnd1"): they generate only
#   through llama.cpp's diffusion example, not by the token-by-token decode the runners use.
LLAMA_CPP_ARCHITECTURES: frozenset[str] = frozenset({
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptneox", "mpt", "baichuan", "starcoder",
    "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe",
    "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2", "phi3", "phimoe",
    "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm", "minicpm3", "gemma",
    "gemma2", "gemma3", "gemma3n", "gemma4", "starcoder2", "mamba", "mamba2", "maple", "jamba",
    "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe",
    "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32",
    "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "jais", "jais2", "nemotron",
    "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6", "rwkv6qwen2", "rwkv7",
    "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch", "granite_swa", "chameleon",
    "plm", "bailingmoe", "bailingmoe2", "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe",
    "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3",
    "hy_v4", "smollm3", "gpt-oss", "lfm2", "lfm2moe", "smallthinker", "seed_oss", "grovemoe",
    "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "pangu-embedded",
    "mistral3", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5", "maincoder", "kimi-linear",
    "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
})


# Encoders llama.cpp embeds with (llama_decode on a non-causal graph, then the file's pooling):
# embedding models (sentence-transformers' BERTs, nomic-embed-text, jina, EmbeddingGemma). They
# load as embedding-only models: /v1/embeddings, /v1/rerank and Ollama's /api/embed answer; a
# chat or completion on one is a 400 saying it makes embeddings, not text.
EMBEDDING_ARCHITECTURES: frozenset[str] = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3",
    "eurobert", "gemma-embedding",
})


def embeds_only(arch: str) -> bool:
    return arch in EMBEDDING_ARCHITECTURES


def llama_cpp_runs(arch: str) -> bool:
    """Whether the pinned llama.cpp runs a GGUF whose general.architecture is `arch` (an
    embedding model's: for embeddings)."""
    return arch in LLAMA_CPP_ARCHITECTURES or arch in EMBEDDING_ARCHITECTURES
