"""A SentencePiece GGUF vocabulary (tokenizer.ggml.model "llama") written as tokenizer.json must
tokenize like llama.cpp on the same file (issue 38: real Gemma 3 files hold one).

Oracle: llama.cpp itself, through llama-cpp-python (`Llama(vocab_only=True).tokenize`) for ids and
engine/loaders/tokenizer.py for bytes and decode. Checked on the raw `tokenizers` file (what
transformers users get) and through Ember's HFTokenizer (what the engine uses). The real Gemma 3
270M tests (slow) also run `ember quantize --method rtn --bits 8` on it end to end."""
from __future__ import annotations

import json
import time
from pathlib import Path

import llama_cpp
import pytest
import tokenizers

from engine.loaders.gguf_vocab import check_hf_tokenizer, write_hf_tokenizer
from engine.loaders.hf_tokenizer import HFTokenizer
from engine.loaders.tokenizer import Tokenizer
from engine.model_files.gguf_file import GGUFFile

CORPUS = sorted((Path(__file__).parents[1] / "data" / "corpus").glob("*.txt"))
SP = "\u2581"
# Pieces of the tiny vocabulary, best score first; their characters are pieces too (below), so
# every merge has two tokens as parts, as in a trained SentencePiece model.
PIECES = ["▁t", "he", "▁the", "▁a", "an", "nd", "▁and", "ll", "llo", "▁he", "▁hello", "▁w", "or",
          "▁wor", "ld", "▁world", "▁▁", "▁▁▁▁", "in", "▁in", "ing", "er", "▁über", "é", "ca", "▁ca",
          "▁café", "ü", "▁ü", "üb", "ber", "日", "本", "日本", "he▁", "▁<", "bos", "<bos"]
CHARS = [chr(c) for c in range(0x21, 0x7F)] + [SP]
TEXTS = ["hello world", "the and the and", " the  and   an\n\nhello ", "Hello, World!\tTabs\n",
         "café über 日本 🙂 ß", "in ing thing\r\n", "", " ", "   ", "x  ", "<bos>hello<eos> there",
         "<start_of_turn>user\n<tool>call</tool><end_of_turn>", "<0x41> is not A", "▁ under▁score",
         "he he▁he", "<bos", "<<bos>>"]


def write_spm_gguf(path: Path, add_space_prefix: bool | None) -> Path:
    """A llama-arch header (no tensors: llama.cpp reads it vocab-only) with a SentencePiece vocab:
    <pad>/<eos>/<bos> control, <unk>, 256 byte tokens, characters, multi-character pieces,
    a control and a user-defined tag. add_space_prefix None leaves the key out (llama.cpp: on)."""
    import gguf

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<tool>"]
    types = [3, 3, 3, 2, 3, 3, 4]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    words = PIECES + [c for c in CHARS if c not in PIECES]
    tokens += words
    types += [1] * len(words)
    scores = [0.0] * (7 + 256) + [-float(i) for i in range(len(words))]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(16)
    w.add_block_count(1)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(8)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_dir(gguf: Path, out: Path) -> Path:
    write_hf_tokenizer(gguf, out)
    (out / "config.json").write_text(json.dumps({"vocab_size": Tokenizer(gguf).vocab_size}))
    return out


def compare(gguf: Path, directory: Path, texts: list[str]) -> tuple[int, Tokenizer, HFTokenizer]:
    """Every text, with and without special-token parsing: raw tokenizer.json ids, HFTokenizer ids
    and decode equal llama.cpp's. Returns how many llama.cpp tokens were compared, and the two
    tokenizers it built (a real 262k vocabulary takes seconds to load: the caller reuses them)."""
    ref = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    engine_ref, hf = Tokenizer(gguf), HFTokenizer(directory)
    raw = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    compared = 0
    for text in texts:
        for special in (True, False):
            raw.encode_special_tokens = not special  # without: control tokens' text is split like any text
            want = ref.tokenize(text.encode(), add_bos=False, special=special)
            compared += len(want)
            assert raw.encode(text, add_special_tokens=False).ids == want, (text[:60], special)
            assert hf.encode(text, add_bos=False, parse_special=special) == want, (text[:60], special)
            for skip in (False, True):
                assert hf.decode(want, skip_special=skip) == engine_ref.decode(want, skip_special=skip)
        assert hf.encode(text) == engine_ref.encode(text)  # BOS as the file says
    assert (hf.bos_id, hf.eos_id, hf.pad_id, hf.add_bos, hf.add_eos, hf.stop_ids) == (
        engine_ref.bos_id, engine_ref.eos_id, engine_ref.pad_id, engine_ref.add_bos, engine_ref.add_eos,
        engine_ref.stop_ids)
    return compared, engine_ref, hf


@pytest.mark.parametrize("prefix", [False, None], ids=["gemma-no-prefix", "llama-default-prefix"])
def test_tiny_sentencepiece_vocab_tokenizes_like_llama_cpp(tmp_path, prefix):
    gguf = write_spm_gguf(tmp_path / "spm.gguf", prefix)
    directory = hf_dir(gguf, tmp_path / "hf")
    compared, ref, hf = compare(gguf, directory, TEXTS)
    assert compared > 100
    for i in range(ref.vocab_size):
        assert hf.token_bytes(i) == ref.token_bytes(i), i
        assert hf.token_bytes(i, special=False) == ref.token_bytes(i, special=False), i
        # <unk> (UNKNOWN) is no control token to llama.cpp's is_control, but it is encoded and
        # rendered as one; tokenizer.json can only say "special"
        assert hf.is_special(i) == (ref.is_special(i) or i == 3), i
    raw = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    llama = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    byte_ids = set(range(7, 7 + 256))
    for text in TEXTS[:10]:  # no tags: tokenizer.json's own decoder gives the text back
        ids = llama.tokenize(text.encode(), add_bos=False, special=False)
        assert raw.decode(ids, skip_special_tokens=False) == text
    fallback = llama.tokenize("café 🙂\n".encode(), add_bos=False, special=False)
    assert byte_ids & set(fallback) and raw.encode("🙂", add_special_tokens=False).tokens[-4:] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
    assert raw.encode("hello").ids[0] == 2  # the post-processor adds BOS, as add_bos_token says
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["model"]["byte_fallback"] is True and ["▁", "t"] in spec["model"]["merges"]
    assert ("Prepend" in json.dumps(spec["normalizer"])) is (prefix is None)


def test_check_hf_tokenizer_accepts_sentencepiece_and_refuses_unigram(tmp_path):
    gguf = write_spm_gguf(tmp_path / "spm.gguf", False)
    f = GGUFFile(gguf)
    try:
        check_hf_tokenizer(gguf, f)
        with pytest.raises(ValueError, match="'t5'"):
            check_hf_tokenizer(gguf, {"tokenizer.ggml.model": "t5"})
    finally:
        f.close()


@pytest.fixture(scope="module")
def gemma():
    from real_models import gemma3_270m_or_skip

    return gemma3_270m_or_skip()


@pytest.mark.slow
def test_real_gemma3_vocab_tokenizes_the_corpus_like_llama_cpp(gemma, tmp_path):
    t0 = time.perf_counter()
    directory = hf_dir(gemma, tmp_path / "hf")
    written = time.perf_counter() - t0
    texts = [f.read_text(encoding="utf-8") for f in CORPUS]
    texts += TEXTS + ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "\n\n\n\t\t  x"]
    compared, ref, hf = compare(gemma, directory, texts)
    print(f"gemma 3 vocab: tokenizer.json written in {written:.1f} s; {compared} llama.cpp tokens compared")
    assert hf.vocab_size == ref.vocab_size == 262144
    assert hf.is_special(212) and hf.encode("</s>", add_bos=False) == [212]  # llama.cpp retypes "</s>"
    for i in [*range(7000), *range(7000, ref.vocab_size, 7)]:  # every tag and byte token, then a sample
        assert hf.token_bytes(i) == ref.token_bytes(i) and hf.is_special(i) == ref.is_special(i), i


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ember_quantize_of_real_gemma3_writes_a_checkpoint_that_tokenizes_and_runs_as_the_gguf(gemma, tmp_path):
    """`ember quantize` (RTN, 8 bits) of the real file no longer refuses its vocabulary; Ember loads
    the checkpoint, its tokenizer gives llama.cpp's ids, and it predicts as the GGUF does."""
    import numpy as np
    import torch

    from app.cli import main
    from engine.loaders.gguf_loader import load_model
    from engine.loaders.load import load_model as load_any
    from engine.loaders.tokenizer import load_tokenizer
    from model_oracles import our_logits

    out = tmp_path / "gemma-rtn8"
    assert main(["quantize", str(gemma), str(out), "--method", "rtn", "--bits", "8", "--no-progress"]) == 0
    hf, ref = load_tokenizer(out), Tokenizer(gemma)
    assert isinstance(hf, HFTokenizer)
    for text in [f.read_text(encoding="utf-8") for f in CORPUS]:
        assert hf.encode(text) == ref.encode(text)  # BOS included, as the file says
    ids = ref.encode("The capital of France is Paris. The capital of Germany is")
    got = np.asarray(our_logits(load_any(out, torch.float32, "cpu"), ids), np.float64)
    want = np.asarray(our_logits(load_model(gemma), ids), np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() < 5e-2  # 8-bit rounding of the file's weights
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert hf.decode([int(got[-1].argmax())]) == " Berlin"
