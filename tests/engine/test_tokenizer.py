"""Tokenizer and IncrementalDetokenizer on the bundled model, against llama.cpp's own Llama API."""
from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.detokenizer import IncrementalDetokenizer
from engine.loaders.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # the bundled model's vocabulary (vocab-only: about a second)

TEXTS = [
    "",
    "Hello, world!",
    " leading space and trailing space ",
    "The quick brown fox jumps over the lazy dog. 1234567890 3.14159 -42 1e-9",
    "Ünïcödé: naïve café, Straße, Ærøskøbing, ½ ¾ ©®™, ǅ ﬁ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "Русский текст и ελληνικά, עברית, العربية, हिन्दी, ไทย",
    "emoji: 🤖👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🫠 🧑🏿‍🚀",
    "def f(x):\n\tif x:\n\t\treturn {'a': [1, 2]}  # comment\n    else:\n        return None\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 1 << 3); return 0; }",
    "spaces:          ten, tabs:\t\t\t\tfour, newlines:\n\n\n\n\nfive, mixed: \t \n \r\n\u00a0\u3000",
    "   \n\n   \t",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n",
    "special tokens inside words: a<|im_end|>b<|endoftext|>c",
    "zero width: a\u200bb\u200dc\ufeffd, combining: e\u0301 a\u0308",
    "URL https://example.com/a?b=c&d=%20e#f and email a.b+c@example.org",
    "x" * 3000,
]


@pytest.fixture(scope="module")
def tok(bundled_model_path) -> Tokenizer:
    return Tokenizer.from_gguf(bundled_model_path)


@pytest.fixture(scope="module")
def oracle(bundled_model_path):
    import llama_cpp

    llm = llama_cpp.Llama(str(bundled_model_path), vocab_only=True, verbose=False)
    yield llm
    llm.close()


def test_metadata_of_the_bundled_vocabulary(tok, oracle):
    assert tok.vocab_size == oracle.n_vocab() == 49152
    assert tok.bos_id == oracle.token_bos() and tok.eos_id == oracle.token_eos()
    im_end = tok.encode("<|im_end|>")
    assert im_end == [tok.eos_id] and tok.eos_id in tok.stop_ids
    assert tok.encode("<|endoftext|>")[0] in tok.stop_ids  # llama.cpp's EOG set
    assert tok.encode("<|im_start|>")[0] not in tok.stop_ids
    assert tok.add_bos is False  # SmolLM2's file says so


@pytest.mark.parametrize("i", range(len(TEXTS)))
@pytest.mark.parametrize("parse_special", [True, False])
def test_encode_matches_llama_cpp(tok, oracle, i, parse_special):
    text = TEXTS[i]
    data = text.encode("utf-8")
    assert tok.encode(text, parse_special=parse_special) == oracle.tokenize(
        data, add_bos=True, special=parse_special)
    assert tok.encode(text, add_bos=False, parse_special=parse_special) == oracle.tokenize(
        data, add_bos=False, special=parse_special)


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_decode_round_trips_and_matches_llama_cpp(tok, oracle, i):
    text = TEXTS[i]
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids) == oracle.detokenize(ids, special=True).decode("utf-8")
    assert b"".join(tok.token_bytes(t) for t in ids) == text.encode("utf-8")


def test_special_tokens_parse_only_when_asked(tok):
    text = "<|im_start|>user"
    special = tok.encode(text)
    plain = tok.encode(text, parse_special=False)
    assert special[0] == tok.bos_id == 1 and 1 not in plain and len(plain) > len(special)
    assert tok.decode(plain) == text
    assert tok.decode(special, skip_special=True) == "user"
    assert tok.token_bytes(tok.eos_id) == b"<|im_end|>"
    assert tok.token_bytes(tok.eos_id, special=False) == b""


def test_add_bos_explicitly(tok):
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_id
    assert tok.encode("hi", add_bos=True)[1:] == tok.encode("hi", add_bos=False)
    assert tok.encode("", add_bos=True) == [tok.bos_id] and tok.encode("") == []
    assert tok.decode([]) == ""


def test_bad_ids_are_clear_errors(tok):
    for bad in (-1, tok.vocab_size, 10**12):
        with pytest.raises(ValueError, match="outside the vocabulary|negative"):
            tok.token_bytes(bad)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode([5, bad])


def test_closed_tokenizer_raises_instead_of_crashing(bundled_model_path):
    t = Tokenizer(bundled_model_path)
    t.close()
    t.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        t.encode("hello")
    with pytest.raises(ValueError, match="closed"):
        t.token_bytes(5)


def test_bad_files_are_clear_errors(tmp_path, bundled_model_path):
    with pytest.raises(FileNotFoundError):
        Tokenizer(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOTAGGUF" * 100)
    with pytest.raises(ValueError, match="could not read a vocabulary"):
        Tokenizer(junk)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(bundled_model_path.read_bytes()[:200_000])  # ends inside the token list
    with pytest.raises(ValueError, match="could not read a vocabulary"):
        Tokenizer(cut)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_any_text_round_trips_and_matches_llama_cpp(tok, oracle, text):
    ids = tok.encode(text, parse_special=False)
    assert ids == oracle.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    assert tok.decode(ids) == oracle.detokenize(ids, special=True).decode("utf-8", "replace")
    if b"".join(tok.token_bytes(t) for t in ids) == text.encode("utf-8"):
        assert tok.decode(ids) == text


def test_bytes_missing_from_the_vocabulary_are_dropped_as_llama_cpp_does(tok, oracle):
    # SmolLM2's byte-level vocabulary has no token for the byte 0xF1, so U+40000 (F1 80 80 80)
    # loses its lead byte in llama.cpp; we must lose it the same way, not "fix" it.
    ids = tok.encode("\U00040000")
    assert ids == oracle.tokenize("\U00040000".encode(), add_bos=False, special=False)
    assert b"".join(tok.token_bytes(t) for t in ids) == b"\x80\x80\x80"


# ---- incremental detokenization ---------------------------------------------------------------
def stream(tok, ids, **kw):
    d = IncrementalDetokenizer(tok, **kw)
    deltas = [d.add(t) for t in ids]
    return deltas, d.flush(), d


@pytest.mark.parametrize("i", range(len(TEXTS)))
def test_stream_never_emits_half_a_character_and_adds_up_to_decode(tok, i):
    ids = tok.encode(TEXTS[i])
    deltas, tail, d = stream(tok, ids, skip_special=False)
    assert "".join(deltas) + tail == tok.decode(ids) == d.text
    assert tail == "" and not any("\ufffd" in x for x in deltas)  # nothing was cut mid-character


def test_multi_token_emoji_waits_for_its_last_byte(tok):
    ids = tok.encode("🫠")
    assert len(ids) > 1  # a rare emoji is several byte tokens in byte-level BPE
    deltas, tail, _ = stream(tok, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == "🫠" and tail == ""


def single_byte_token(tok, byte: int) -> int:
    return next(t for t in range(tok.vocab_size) if tok.token_bytes(t) == bytes([byte]))


def test_dangling_bytes_become_one_replacement_char_at_flush(tok):
    # the first two bytes of a 4-byte character, then the stream ends
    ids = [single_byte_token(tok, 0xF0), single_byte_token(tok, 0x9F)]
    deltas, tail, d = stream(tok, ids)
    assert deltas == ["", ""] and d.has_pending_bytes is False and tail == "\ufffd"
    assert d.text == tok.decode(ids)


def test_invalid_byte_in_the_middle_is_replaced_like_decode(tok):
    ids = tok.encode("ab") + [single_byte_token(tok, 0x80)] + tok.encode("cd")
    deltas, tail, _ = stream(tok, ids)
    assert "".join(deltas) + tail == tok.decode(ids) == "ab\ufffdcd"


def test_stream_leaves_control_tokens_out_by_default_like_llama_cpp_server(tok):
    ids = tok.encode("<|im_start|>assistant\nHi!<|im_end|>")
    deltas, tail, _ = stream(tok, ids)
    assert "".join(deltas) + tail == "assistant\nHi!" == tok.decode(ids, skip_special=True)
    deltas, tail, _ = stream(tok, ids, skip_special=False)
    assert "".join(deltas) + tail == "<|im_start|>assistant\nHi!<|im_end|>"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_stream_of_any_text(tok, text):
    ids = tok.encode(text, parse_special=False)
    deltas, tail, _ = stream(tok, ids)
    assert "".join(deltas) + tail == tok.decode(ids)
    assert not any("\ufffd" in x for x in deltas) or "\ufffd" in tok.decode(ids)


def test_concurrent_encoding_gives_the_same_ids(tok):
    expected = {t: tok.encode(t) for t in TEXTS}
    errors: list[str] = []

    def work():
        for _ in range(20):
            for t in TEXTS:
                if tok.encode(t) != expected[t]:
                    errors.append(t)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
