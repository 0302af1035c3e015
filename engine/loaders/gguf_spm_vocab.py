"""A SentencePiece-BPE GGUF vocabulary (tokenizer.ggml.model "llama": Gemma, Llama 2, Mistral v0.1)
as a `tokenizers` BPE model, so a checkpoint written from the GGUF tokenizes like llama.cpp.

llama.cpp's SPM tokenizer (llm_tokenizer_spm, llama-vocab.cpp) keeps no merge list: it starts from
the UTF-8 characters of the text (spaces escaped to "▁"), repeatedly joins the adjacent pair whose
concatenation is a token with the highest score (leftmost first on ties), and spells what is left
unknown as <0xXX> byte tokens. A BPE whose merges are "every split of a token into two tokens,
ranked by the whole token's score" does the same (transformers' SentencePieceExtractor builds its
Llama/Gemma tokenizer.json that way), with byte_fallback for the byte tokens. The space prefix
follows tokenizer.ggml.add_space_prefix (llama.cpp's default for SPM is on; Gemma's files say off);
llama.cpp adds it to every text fragment between special tokens, which is what a normalizer does
(added tokens are cut out before normalizing), not Metaspace's prepend_scheme "first".
"""
from __future__ import annotations

import tokenizers
from tokenizers import decoders, models, normalizers, processors

SPACE = "\u2581"


def spm_merges(vocab: dict[str, int], scores: list[float]) -> list[tuple[str, str]]:
    """(left, right) for every token that splits into two tokens, best merged-token score first.

    Ties (equal scores: control and byte tokens) go by the merged token's id, then the shorter
    left part, so the order does not depend on dict iteration."""
    ranked = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def spm_tokenizer(vocab: dict[str, int], scores: list[float], *, unk: str | None,
                  add_space_prefix: bool, bos: str | None) -> tokenizers.Tokenizer:
    """The BPE, its "▁" normalizer, and a decoder that turns "▁" and <0xXX> back into text.

    `bos`: the BOS text when the file says to add one, for a post-processor that adds it as
    transformers' Llama/Gemma tokenizers do (Ember's HFTokenizer adds BOS itself from the config)."""
    byte_fallback = all(f"<0x{b:02X}>" in vocab for b in range(256))
    model = models.BPE(vocab, spm_merges(vocab, scores), unk_token=unk if unk in vocab else None,
                       fuse_unk=True, byte_fallback=byte_fallback)
    tk = tokenizers.Tokenizer(model)
    escape = normalizers.Replace(" ", SPACE)
    tk.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE), escape]) if add_space_prefix
                     else escape)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tk.decoder = decoders.Sequence(steps)
    if bos is not None and bos in vocab:
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    return tk
