"""A BERT folder (bert_folder.py) written as the GGUF that llama.cpp's convert_hf_to_gguf.py
writes for it, so llama.cpp embeds it: architecture "bert" with non-causal attention and the
folder's pooling, the WordPiece vocabulary as tokenizer model "bert" in its phantom-space
spelling ("##ing" -> "ing", "play" -> "\u2581play", control tokens as they are), [CLS] as BOS and
[SEP] as EOS (both added), and gguf's own BERT tensor names. Matrices are f16 or f32; vectors
(norms, biases) and the position and token-type tables stay f32, as the converter keeps them.

Torch-free (numpy, gguf), so the model store converts on import without the engine.
"""
from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np

from engine.model_files.bert_folder import BertFolder, read_bert_folder
from engine.model_files.errors import ModelFileError
from engine.model_files.safetensors_file import float_tensors

OUTTYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "f32": gguf.LlamaFileType.ALL_F32}
POOLING = {"mean": gguf.PoolingType.MEAN, "cls": gguf.PoolingType.CLS, "last": gguf.PoolingType.LAST}
KEEP_F32 = ("position_embd.weight", "token_types.weight")
DROPPED = ("embeddings.position_ids", "pooler.", "cls.predictions", "cls.seq_relationship")  # not the encoder's
LAYER_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm", "ffn_up", "ffn_down",
                 "layer_output_norm")


def convert_bert_folder(src: Path, out: Path, outtype: str = "f16") -> Path:
    """Write `src` (a sentence-transformers or Hugging Face BERT folder) to `out` as a GGUF;
    ModelFileError, before anything is written, for a folder that is not one llama.cpp runs.
    The file appears under its name only when whole."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {', '.join(OUTTYPES)}")
    folder = read_bert_folder(src)
    tensors = encoder_tensors(folder)
    out = Path(out)
    part = out.with_name(out.name + ".part")
    writer = gguf.GGUFWriter(str(part), "bert")
    try:
        _write_hparams(writer, folder, OUTTYPES[outtype])
        _write_vocab(writer, folder)
        for name, array in tensors.items():
            writer.add_tensor(name, _stored(name, array, outtype))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(part, out)
    return out


def encoder_tensors(folder: BertFolder) -> dict[str, np.ndarray]:
    """The checkpoint's encoder tensors under their GGUF names, every one the config implies
    present with the shape it implies."""
    cfg = folder.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    out = {}
    for name, array in float_tensors(folder.weights).items():
        name = name.removeprefix("bert.")
        name = name[:-6] + ".weight" if name.endswith(".gamma") else name[:-5] + ".bias" if name.endswith(".beta") else name
        if name.startswith(DROPPED):
            continue
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ModelFileError(f"{folder.weights}: tensor {name!r} is not part of a BERT encoder")
        out[new] = array
    for name, shape in _expected_shapes(cfg, len(folder.tokens)).items():
        if name not in out:
            raise ModelFileError(f"{folder.weights}: tensor {name} ({_hf_name(names, name)}) is missing")
        if tuple(out[name].shape) != shape:
            raise ModelFileError(f"{folder.weights}: {_hf_name(names, name)} has shape {list(out[name].shape)}, "
                                 f"config.json implies {list(shape)}")
    return out


def _expected_shapes(cfg: dict, n_vocab: int) -> dict[str, tuple[int, ...]]:
    h, ff = cfg["hidden_size"], cfg["intermediate_size"]
    shapes = {"token_embd.weight": (n_vocab, h), "position_embd.weight": (cfg["max_position_embeddings"], h),
              "token_types.weight": (int(cfg.get("type_vocab_size", 1)), h),
              "token_embd_norm.weight": (h,), "token_embd_norm.bias": (h,)}
    per_layer = {"attn_q": (h, h), "attn_k": (h, h), "attn_v": (h, h), "attn_output": (h, h),
                 "attn_output_norm": None, "ffn_up": (ff, h), "ffn_down": (h, ff), "layer_output_norm": None}
    for i in range(cfg["num_hidden_layers"]):
        for t in LAYER_TENSORS:
            weight = per_layer[t] or (h,)
            shapes[f"blk.{i}.{t}.weight"] = weight
            shapes[f"blk.{i}.{t}.bias"] = (weight[0],)
    return shapes


def _hf_name(names: gguf.TensorNameMap, gguf_name: str) -> str:
    """The checkpoint's name for a GGUF tensor name, for messages."""
    base, _, suffix = gguf_name.rpartition(".")
    for hf, (_, mapped) in names.mapping.items():
        if mapped == base and hf.startswith(("embeddings.", "encoder.")):
            return f"{hf}.{suffix}"
    return gguf_name


def _stored(name: str, array: np.ndarray, outtype: str) -> np.ndarray:
    if outtype == "f16" and array.ndim == 2 and name not in KEEP_F32:
        return array.astype(np.float16)
    return array.astype(np.float32)


def _write_hparams(w: gguf.GGUFWriter, folder: BertFolder, file_type: gguf.LlamaFileType) -> None:
    cfg = folder.config
    w.add_name(folder.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(float(cfg.get("layer_norm_eps", 1e-12)))
    w.add_file_type(file_type)
    w.add_causal_attention(False)
    if folder.pooling is not None:
        w.add_pooling_type(POOLING[folder.pooling])


def _write_vocab(w: gguf.GGUFWriter, folder: BertFolder) -> None:
    w.add_token_type_count(int(folder.config.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")  # llama.cpp's WordPiece tokenizer has one pre-tokenizer whatever this says
    w.add_token_list([phantom(t, kind) for t, kind in zip(folder.tokens, folder.token_types)])
    w.add_token_types(folder.token_types)
    s = folder.special
    w.add_bos_token_id(s["cls"])
    w.add_eos_token_id(s["sep"])
    w.add_unk_token_id(s["unk"])
    w.add_sep_token_id(s["sep"])
    if "pad" in s:
        w.add_pad_token_id(s["pad"])
    if "mask" in s:
        w.add_mask_token_id(s["mask"])
    w.add_add_bos_token(True)  # [CLS] text [SEP]
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)


def phantom(token: str, kind: int) -> str:
    """llama.cpp's spelling of a WordPiece token: a word's start carries U+2581, a continuation
    ("##") does not, a control token stays as it is."""
    if kind == gguf.TokenType.CONTROL:
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token
