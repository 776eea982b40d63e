"""BERT WordPiece (`tokenizer.ggml.model == "bert"`) on the `tokenizers` WordPiece engine.

llama.cpp's WPM tokenizer normalises (lower-case and strip accents per
`tokenizer.ggml.normalizer.*`, both on by default), splits on whitespace and isolates
punctuation, ASCII symbols and CJK characters, drops control characters, then matches
each word, prefixed with the phantom space `▁`, greedily longest-first; a word with an
unmatched position becomes one UNK token. GGUF stores word-initial pieces as `▁piece`
and continuation pieces bare (the converter rewrote BERT's `##piece`).

On the `tokenizers` side that is `BertNormalizer` + `BertPreTokenizer` + `Metaspace`
(prepending `▁` to every word) + `WordPiece` whose vocabulary maps each GGUF token `t`
to `t` when it starts with `▁` and to `##t` as a continuation. Residual differences from
llama.cpp (no llama.cpp oracle for BERT here): `tokenizers` drops only non-spacing marks
after NFD where llama.cpp maps each code point to its first NFD code point and drops every
mark; multi-code-point lower-casing (e.g. `İ`); and a word that already starts with `▁`.
"""

from __future__ import annotations

from llamay.tok.vocab import Vocab

PHANTOM = "▁"


def wordpiece_vocab(tokens: list[str]) -> dict[str, int]:
    """The `tokenizers` WordPiece vocabulary for GGUF-form BERT tokens."""
    out: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if t.startswith(PHANTOM):
            out.setdefault(t, i)
        out.setdefault("##" + t, i)
    return out


def build_wordpiece(vocab: Vocab):
    from tokenizers import Tokenizer, normalizers
    from tokenizers import pre_tokenizers as pt
    from tokenizers.models import WordPiece

    wp_vocab = wordpiece_vocab(vocab.tokens)
    unk_id = vocab.special["unk"]
    unk = "[UNK]"
    if unk_id is not None:
        unk = vocab.tokens[unk_id]
        wp_vocab.setdefault(unk, unk_id)
    model = WordPiece(
        wp_vocab, unk_token=unk, continuing_subword_prefix="##", max_input_chars_per_word=1 << 30
    )
    tk = Tokenizer(model)
    tk.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=vocab.strip_accents,
        lowercase=vocab.lowercase,
    )
    tk.pre_tokenizer = pt.Sequence(
        [
            pt.BertPreTokenizer(),
            pt.Metaspace(replacement=PHANTOM, prepend_scheme="always", split=False),
        ]
    )
    return tk
