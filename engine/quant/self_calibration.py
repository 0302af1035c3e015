"""Self-calibration: text the model writes itself, mixed into the calibration set.

GPTQ's error feedback moves rounding error into the input directions its Hessian says are
unused, and AWQ gives finer steps to the channels its data makes large; both trust the
calibration text to look like what the model will read. Python's documentation and code
(calibration.py) cover English prose and code only, and a GPTQ checkpoint calibrated on them
alone was worse than round-to-nearest on other languages (SmolLM2-135M, g128: European
languages 198 against RTN's 92, CJK 51 against 25). Samples drawn from the model itself follow
the distribution it was trained for, whatever its languages, with no download and no licence
question (Williams et al. 2025, "Self-calibration for language model quantization and
pruning"). Here the model answers a fixed set of requests, in several languages and kinds of
text, through its own chat template, sampled at temperature 1 with a fixed seed; the
chat-formatted prompt is kept, since that is what the model reads in use.

The same model must give the same text on every machine, or the quality of `ember quantize`
depends on where it runs (issue 44: GPTQ beat RTN on one machine and lost on another). Two things
make it so. The replies come from float32 copies of the weights on torch's kernels, not from
Ember's quantized kernels, whose AVX-512 path rounds its activations differently from the AVX2
one; torch's float32 differs between machines only in the last bits. And the sampler's noise is
keyed by token id (engine/sampling/race_noise.py), so last-bit differences change a token only
where the race itself ties. A model whose float32 copy does not fit in half the free memory
runs on its quantized weights, and the log says its text may then differ between CPU paths.
"""
from __future__ import annotations

import functools
import logging
import math
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

# Requests whose answers spread over languages, prose, code and markup (written for Ember).
REQUESTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how the gears of a bicycle work, for a curious twelve-year-old.",
    "Schreibe einen kurzen Text über einen Herbsttag in einer alten Stadt.",
    "Écris une lettre à un ami pour lui raconter tes vacances à la montagne.",
    "Escribe una receta tradicional de tu región, paso a paso.",
    "Напиши короткий рассказ о зимнем вечере в деревне.",
    "日本の四季について、短い文章を書いてください。",
    "写一段关于城市早晨的短文。",
    "Write a Python function that reads a CSV file and sums one column, with comments.",
    "Write a C function that reverses a singly linked list, and explain it.",
    "Write a README in Markdown for a small command-line tool, with a table and a list.",
    "Describe the history of the printing press and why it mattered.",
    "Scrivi una breve poesia sul mare d'estate.",
    "Escreva um parágrafo sobre a importância de dormir bem.",
    "Write a JSON object describing three books, then explain its fields.",
    "Give step-by-step instructions for solving a quadratic equation, with an example.",
)


def self_generated_text(model: str | Path, num_replies: int, max_tokens: int, seed: int = 0) -> str:
    """num_replies chat turns (prompt and reply) the model at `model` writes itself, joined by
    blank lines. Runs Ember's torch engine on the CPU, all replies batched."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    if num_replies < 1:
        return ""
    dense = float32_bytes(Path(model)) < psutil.virtual_memory().available // 2
    if not dense:
        log.warning("%s: a float32 copy does not fit in half the free memory; the model writes its "
                    "calibration replies on its quantized weights, which may differ between CPU paths", model)
    engine = LLMEngine(EngineConfig(model_path=str(model), max_num_seqs=num_replies, enable_prefix_caching=False,
                                    max_model_len=512 + max_tokens,
                                    **(dict(weights="dense", dtype="float32") if dense else {})))
    try:
        prompts = [engine.chat_template.render([{"role": "user", "content": REQUESTS[i % len(REQUESTS)]}],
                                               add_generation_prompt=True) for i in range(num_replies)]
        params = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=max_tokens, seed=seed + i)
                  for i in range(num_replies)]
        outs = engine.generate(prompts, params)
    finally:
        engine.close()
    return "\n\n".join(p + o.text for p, o in zip(prompts, outs))


def calibration_replies(model: str | Path, num_replies: int, max_tokens: int) -> str:
    """self_generated_text, written once per process for a model file as it is now: the methods
    quantized one after another from one model (`ember bench quant`'s variants and groups, the
    tests' GPTQ then AWQ) calibrate on the same replies, and the engine that writes them is the
    costly part of a small model's quantization."""
    path = Path(model)
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())
    return _replies(str(path), stamp, num_replies, max_tokens)


@functools.lru_cache(maxsize=4)
def _replies(model: str, _stamp: tuple, num_replies: int, max_tokens: int) -> str:
    return self_generated_text(model, num_replies, max_tokens)


def float32_bytes(model: Path) -> int:
    """What the model's weights take as float32: 4 bytes a parameter (a GGUF file, or a folder
    of safetensors)."""
    if model.is_dir():
        from safetensors import safe_open

        n = 0
        for f in sorted(model.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
        return 4 * n
    from engine.model_files.meta import read_gguf_meta

    return 4 * read_gguf_meta(model).parameter_count


def interleave(a: str, b: str, step: int = 2048) -> str:
    """a and b in alternating pieces of `step` characters (a first), the longer one's rest at the
    end: consecutive calibration windows then see both kinds of text."""
    return "".join(a[k:k + step] + b[k:k + step] for k in range(0, max(len(a), len(b)), step))
