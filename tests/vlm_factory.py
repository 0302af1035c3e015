"""A tiny random vision model: a Gemma 3 LM GGUF plus its projector ("mmproj") GGUF, for tests.

No real vision model ships offline here, so tests of the image path write one: `write_tiny_vlm(dir)`
writes `lm.gguf` (tests/arch_ggufs.py's tiny gemma3, 64 wide) and `mmproj.gguf`, a projector of
type "gemma3" that llama.cpp's libmtmd (llama-cpp-python 0.3.36) loads, encodes and evaluates.
Random weights: the files prove the plumbing (an image changes the logits, the same pixels give the
same bits, the token count is mtmd's), never answer quality.

The projector file follows llama.cpp's convert_hf_to_gguf.py for Gemma 3 (keys `clip.*`, tensors
`v.*` and `mm.*` as tools/mtmd/clip-impl.h names them) and tools/mtmd/models/siglip.cpp's graph:
a SigLIP ViT (conv patch embedding, learnt positions, pre-norm blocks with biases, GELU MLP, a
final LayerNorm), then an average pool of `merge` x `merge` patches, an RMS norm
(`mm.soft_emb_norm`) and a projection to the LM's width (`mm.input_projection`, stored
[vision width, LM width] as Google's checkpoint holds it). Every image is resized to `image` px
square, so it always yields ((image / patch) / merge)^2 tokens; mtmd wraps them in the text
"<start_of_image>" ... "<end_of_image>" and evaluates them with non-causal attention.

`write_tiny_qwen2vl(dir)` writes the M-RoPE kind: a qwen2vl LM (Qwen2-VL's and Qwen2.5-VL's
architecture, with `rope.dimension_sections`) and a qwen2.5vl_merger (or qwen2vl_merger) projector,
whose images take fewer positions than tokens.

SmolVLM's kind (a llama LM with its image tokens, an idefics3 projector): tests/smolvlm_factory.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

from arch_ggufs import TINY, _Tensors, _tokenizer, write_arch_gguf
from gguf import MODEL_ARCH, MODEL_TENSOR

LM_WIDTH = 64  # arch_ggufs' embedding width: the projector's output must match it


@dataclass(frozen=True)
class TinyVlm:
    """The two files and what mtmd should report for any one image."""
    model: Path
    mmproj: Path
    image_size: int
    image_tokens: int  # embeddings per image (also its positions: gemma3 is not M-RoPE)


def write_mmproj(path: Path, *, image: int = 64, patch: int = 8, merge: int = 2, width: int = 32,
                 heads: int = 2, ffn: int = 64, layers: int = 1, lm_width: int = LM_WIDTH,
                 seed: int = 0, projector_type: str = "gemma3", preproc: int | None = None) -> Path:
    """Write a random gemma3-type projector GGUF (`projector_type` names another type in its header
    only, for the checks that read it, but "idefics3" writes SmolVLM's projection); return `path`.
    preproc: idefics3's longest side before tiling (default `image`: one tile)."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-gemma3-mmproj")
    w.add_string("clip.projector_type", projector_type)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    for key, value in (("image_size", image), ("patch_size", patch), ("embedding_length", width),
                       ("feed_forward_length", ffn), ("projection_dim", lm_width), ("block_count", layers),
                       ("attention.head_count", heads), ("projector.scale_factor", merge)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    if projector_type == "idefics3":  # images are resized to this longest side, then cut into image x image tiles
        w.add_uint32("clip.vision.preproc_image_size", preproc or image)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def put(name: str, shape: tuple[int, ...], scale: float = 0.1, mean: float = 0.0) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(shape) * scale).astype(np.float32))

    put("v.patch_embd.weight", (width, 3, patch, patch))  # ggml {patch, patch, 3, width}
    put("v.patch_embd.bias", (width,))
    put("v.position_embd.weight", ((image // patch) ** 2, width))
    for i in range(layers):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            put(p + name + ".weight", (width, width), 0.2)
            put(p + name + ".bias", (width,))
        for name in ("ln1", "ln2"):
            put(p + name + ".weight", (width,), 0.1, 1.0)
            put(p + name + ".bias", (width,))
        put(p + "ffn_up.weight", (ffn, width), 0.2)
        put(p + "ffn_up.bias", (ffn,))
        put(p + "ffn_down.weight", (width, ffn), 0.2)
        put(p + "ffn_down.bias", (width,))
    put("v.post_ln.weight", (width,), 0.1, 1.0)
    put("v.post_ln.bias", (width,))
    if projector_type == "idefics3":  # SmolVLM's: a pixel shuffle of merge x merge patches, then one matrix
        put("mm.model.fc.weight", (lm_width, width * merge * merge), 0.3)
    else:
        put("mm.soft_emb_norm.weight", (width,), 0.1, 1.0)
        put("mm.input_projection.weight", (width, lm_width), 0.3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_vlm(folder: Path, *, image: int = 64, patch: int = 8, merge: int = 2, seed: int = 0,
                   chat_template: str | None = None, qtype: GGMLQuantizationType | None = None) -> TinyVlm:
    """Write lm.gguf and mmproj.gguf into `folder`; return their paths and the image token count.
    `qtype`: the LM's matrices in that block type (Q8_0: each row's sums independent of the batch,
    so replies are the same whatever else runs), else f32."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "lm.gguf"
    write_arch_gguf(model, "gemma3", chat_template=chat_template, seed=seed, qtype=qtype)
    mmproj = write_mmproj(folder / "mmproj.gguf", image=image, patch=patch, merge=merge, seed=seed + 1)
    return TinyVlm(model, mmproj, image, (image // patch // merge) ** 2)


def write_qwen2vl_lm(path: Path, *, seed: int = 0, qtype: GGMLQuantizationType | None = None,
                     chat_template: str | None = None) -> Path:
    """A tiny random Qwen2-VL / Qwen2.5-VL LM (architecture "qwen2vl": qwen2's layers, q/k/v biases,
    M-RoPE over `rope.dimension_sections` [2, 3, 3, 0] of each head's 8 rotated pairs)."""
    rng, d = np.random.default_rng(seed), TINY
    w = GGUFWriter(str(path), "qwen2vl")
    t, T = _Tensors(w, MODEL_ARCH.QWEN2VL, rng, 0.0, qtype), MODEL_TENSOR
    w.add_name("tiny-qwen2vl")
    for add, value in ((w.add_context_length, 4096), (w.add_embedding_length, d.embd), (w.add_block_count, 2),
                       (w.add_feed_forward_length, d.ff), (w.add_head_count, d.heads),
                       (w.add_head_count_kv, d.kv_heads), (w.add_rope_freq_base, 1000000.0),
                       (w.add_layer_norm_rms_eps, 1e-6)):
        add(value)
    w.add_rope_dimension_sections([2, 3, 3, 0])
    w.add_file_type(0 if qtype is None else 7)
    _tokenizer(w, chat_template, "qwen2")
    t.add(T.TOKEN_EMBD, (_vocab(), d.embd))
    for i in range(2):
        t.add(T.ATTN_NORM, (d.embd,), bid=i, fill=1.0)
        for kind, rows in ((T.ATTN_Q, d.heads * d.head_dim), (T.ATTN_K, d.kv_heads * d.head_dim),
                           (T.ATTN_V, d.kv_heads * d.head_dim)):
            t.add(kind, (rows, d.embd), bid=i)
            t.add(kind, (rows,), bid=i, suffix="bias")
        t.add(T.ATTN_OUT, (d.embd, d.heads * d.head_dim), bid=i)
        t.add(T.FFN_NORM, (d.embd,), bid=i, fill=1.0)
        t.add(T.FFN_GATE, (d.ff, d.embd), bid=i)
        t.add(T.FFN_UP, (d.ff, d.embd), bid=i)
        t.add(T.FFN_DOWN, (d.embd, d.ff), bid=i)
    t.add(T.OUTPUT_NORM, (d.embd,), fill=1.0)
    t.add(T.OUTPUT, (_vocab(), d.embd))
    _close(w)
    return path


def write_qwen2vl_mmproj(path: Path, *, patch: int = 8, width: int = 32, heads: int = 2, layers: int = 2,
                         seed: int = 0, lm_width: int = LM_WIDTH, projector_type: str = "qwen2.5vl_merger") -> Path:
    """A random Qwen2.5-VL ("qwen2.5vl_merger") or Qwen2-VL ("qwen2vl_merger") projector
    (tools/mtmd/models/qwen2vl.cpp): two patch convolutions (a still image is both frames), a ViT
    with 2D M-RoPE, then an MLP over each 2 x 2 patches; Qwen2.5-VL's has RMS norms, a gated SiLU
    MLP and windowed attention in all but every `n_wa_pattern`-th layer, Qwen2-VL's LayerNorms and
    a GELU MLP. Images keep their aspect, resized to multiples of 2 patches, so an image of
    nx x ny merged patches is nx * ny tokens at max(nx, ny) positions."""
    rng, v25 = np.random.default_rng(seed), projector_type == "qwen2.5vl_merger"
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-qwen2vl-mmproj")
    w.add_string("clip.projector_type", projector_type)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_silu" if v25 else "clip.use_gelu", True)
    if v25:
        w.add_uint32("clip.vision.n_wa_pattern", 2)
    for key, value in (("image_size", 560), ("patch_size", patch), ("embedding_length", width),
                       ("feed_forward_length", 2 * width), ("projection_dim", lm_width), ("block_count", layers),
                       ("attention.head_count", heads)):
        w.add_uint32(f"clip.vision.{key}", value)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def put(name: str, shape: tuple[int, ...], scale: float = 0.1, mean: float = 0.0) -> None:
        w.add_tensor(name, (mean + rng.standard_normal(shape) * scale).astype(np.float32))

    put("v.patch_embd.weight", (width, 3, patch, patch))
    put("v.patch_embd.weight.1", (width, 3, patch, patch))
    for i in range(layers):
        p = f"v.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            put(p + name + ".weight", (width, width), 0.2)
            put(p + name + ".bias", (width,))
        for name in ("ln1", "ln2"):
            put(p + name + ".weight", (width,), 0.1, 1.0)
            put(p + name + ".bias", (width,))
        put(p + "ffn_up.weight", (2 * width, width), 0.2)
        put(p + "ffn_up.bias", (2 * width,))
        put(p + "ffn_down.weight", (width, 2 * width), 0.2)
        put(p + "ffn_down.bias", (width,))
        if v25:
            put(p + "ffn_gate.weight", (2 * width, width), 0.2)
            put(p + "ffn_gate.bias", (2 * width,))
    put("mm.0.weight", (4 * width, 4 * width), 0.2)
    put("mm.0.bias", (4 * width,))
    put("mm.2.weight", (lm_width, 4 * width), 0.3)
    put("mm.2.bias", (lm_width,))
    _close(w)
    return path


def write_tiny_qwen2vl(folder: Path, *, seed: int = 0, qtype: GGMLQuantizationType | None = None,
                       projector_type: str = "qwen2.5vl_merger", chat_template: str | None = None) -> TinyVlm:
    """lm.gguf (qwen2vl) and mmproj.gguf (`projector_type`) in `folder`; random_pixels' default
    48 x 40 image becomes 48 x 48 px: 3 x 3 merged patches, 9 tokens at 3 positions."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = write_qwen2vl_lm(folder / "lm.gguf", seed=seed, qtype=qtype, chat_template=chat_template)
    proj = write_qwen2vl_mmproj(folder / "mmproj.gguf", seed=seed + 1, projector_type=projector_type)
    return TinyVlm(model, proj, 48, 9)


def _vocab() -> int:
    from arch_ggufs import vocab_size
    return vocab_size()


def _close(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_pixels(seed: int, height: int = 48, width: int = 40) -> np.ndarray:
    """An RGB image [height, width, 3] of uint8 noise (mtmd resizes it to the model's size)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
