"""The tiny architecture files (tests/arch_ggufs.py) against llama.cpp and gguf-py: every real one
loads and generates in llama-cpp-python, its header says what `write_arch_gguf` claims, and the
made-up architecture is refused, so tests built on them start from files a real runner accepts."""
from __future__ import annotations

import gguf
import llama_cpp
import pytest

from arch_ggufs import ARCHS, UNKNOWN_ARCH, ArchFacts, vocab_size, write_arch_gguf

CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}{% endif %}")


def _field(reader: gguf.GGUFReader, key: str):
    fld = reader.get_field(key)
    return None if fld is None else fld.contents()


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_loads_and_generates(tmp_path, arch):
    # gemma3 base models ship no chat template; the others get one, so both paths are covered
    template = None if arch == "gemma3" else CHATML
    path = tmp_path / f"{arch}.gguf"
    facts = write_arch_gguf(path, arch, chat_template=template)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False)
    try:
        assert llm.n_vocab() == vocab_size()
        out = llm("hello", max_tokens=4, temperature=0)
        assert isinstance(out["choices"][0]["text"], str)
        assert llm.metadata.get("tokenizer.chat_template") == template
    finally:
        llm.close()
    assert facts.arch == arch


@pytest.mark.parametrize("arch", ARCHS + (UNKNOWN_ARCH,))
def test_header_round_trips(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    facts = write_arch_gguf(path, arch)
    r = gguf.GGUFReader(path)
    assert _field(r, "general.architecture") == arch
    assert _field(r, f"{arch}.block_count") == facts.num_layers
    assert _field(r, f"{arch}.attention.head_count") == facts.num_heads
    assert _field(r, f"{arch}.attention.head_count_kv") == facts.num_kv_heads
    assert _field(r, f"{arch}.attention.key_length") == facts.head_dim
    assert _field(r, f"{arch}.context_length") == facts.context_length
    assert _field(r, f"{arch}.attention.sliding_window") == (facts.sliding_window or None)
    assert _field(r, "tokenizer.chat_template") is None
    blocks = {int(t.name.split(".")[1]) for t in r.tensors if t.name.startswith("blk.")}
    assert blocks == set(range(facts.num_layers))
    assert all(0 <= i < facts.num_layers for i in facts.sliding_layers)


def test_facts_of_the_sliding_window_archs(tmp_path):
    """The layer patterns llama.cpp assumes when the file names none (see arch_ggufs)."""
    gemma = write_arch_gguf(tmp_path / "g.gguf", "gemma3")
    assert gemma.sliding_window > 0 and gemma.sliding_layers == (0, 1, 2, 3, 4)
    oss = write_arch_gguf(tmp_path / "o.gguf", "gpt-oss")
    assert oss.sliding_window > 0 and oss.sliding_layers == tuple(range(0, oss.num_layers, 2))
    assert write_arch_gguf(tmp_path / "q.gguf", "qwen3") == ArchFacts(
        "qwen3", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, context_length=4096,
        sliding_window=0, sliding_layers=())


def test_same_seed_same_bytes(tmp_path):
    write_arch_gguf(tmp_path / "a.gguf", "qwen3moe", seed=3)
    write_arch_gguf(tmp_path / "b.gguf", "qwen3moe", seed=3)
    write_arch_gguf(tmp_path / "c.gguf", "qwen3moe", seed=4)
    a, b, c = ((tmp_path / n).read_bytes() for n in ("a.gguf", "b.gguf", "c.gguf"))
    assert a == b and a != c


def test_llama_cpp_refuses_the_unknown_arch(tmp_path):
    path = tmp_path / "unknown.gguf"
    write_arch_gguf(path, UNKNOWN_ARCH)
    with pytest.raises(ValueError):
        llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False)


def test_rejects_an_arch_it_does_not_write(tmp_path):
    with pytest.raises(ValueError):
        write_arch_gguf(tmp_path / "x.gguf", "mamba")
