"""GPT-2 style byte-level BPE (`tokenizer.ggml.model == "gpt2"`) on the `tokenizers` engine.

llama.cpp's BPE merges, inside each pre-token, the adjacent pair of lowest merge rank
(leftmost first on ties) until none applies: the same procedure as the `tokenizers` BPE
model. Pre-tokens come from the regexes of `pretokenize.py`, then the GPT-2 byte-to-
unicode mapping; with `ignore_merges` a pre-token that is itself a token is emitted whole.

Merges whose parts or result are not in the vocabulary cannot be represented in a
`tokenizers` model and are dropped (llama.cpp would perform them and then fall back to
byte tokens: only malformed vocabularies have such merges); for a repeated pair the first
rank wins, as in llama.cpp.
"""

from __future__ import annotations

from llamay.tok.pretokenize import pre_tokenizer
from llamay.tok.vocab import Vocab


def parse_merges(merges: list[str], token_to_id: dict[str, int]) -> list[tuple[str, str]]:
    """GGUF merge strings ("a b", split at the first space after position 0) as pairs."""
    # comprehensions rather than one loop: SmolLM2's 49k merges in a third of the time
    pairs = [(m[:p], m[p + 1 :]) for m in merges if (p := m.find(" ", 1)) > 0]
    return [
        (a, b)
        for a, b in dict.fromkeys(pairs)
        if a in token_to_id and b in token_to_id and (a + b) in token_to_id
    ]


def build_bpe(vocab: Vocab):
    """A `tokenizers.Tokenizer` that maps one raw-text fragment to llama.cpp's BPE ids."""
    assert vocab.pre_spec is not None and vocab.merges is not None
    merges = parse_merges(vocab.merges, vocab.token_to_id)
    return _engine(vocab, vocab.token_to_id, merges, pre_tokenizer(vocab.pre_spec))


def _engine(vocab: Vocab, token_to_id: dict[str, int], merges, pre):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    tk = Tokenizer(BPE(token_to_id, merges, ignore_merges=vocab.ignore_merges))
    tk.pre_tokenizer = pre
    return tk


class BpeSubsets:
    """Engines of `build_bpe` cut down to what encoding given fragments can touch.

    A merge result is a substring of a pre-token, so the tokens occurring in the
    fragments' pre-tokens and the merges producing them (found by splitting each such
    token, not by parsing every merge string) give the same ids as the full engine."""

    def __init__(self, vocab: Vocab) -> None:
        assert vocab.pre_spec is not None and vocab.merges is not None
        self.vocab = vocab
        self.pre = pre_tokenizer(vocab.pre_spec)
        n = len(vocab.merges)  # merge string -> rank; the first of repeats wins
        self.rank = dict(zip(reversed(vocab.merges), range(n - 1, -1, -1), strict=True))

    def __call__(self, frags: list[str]):
        words = [w for f in frags for w, _ in self.pre.pre_tokenize_str(f)]
        found = self.vocab.tokens_in(words)
        ranked = []
        for s in found:
            for k in range(1, len(s)):
                m = f"{s[:k]} {s[k:]}"
                r = self.rank.get(m)
                if r is not None and m.find(" ", 1) == k and s[:k] in found and s[k:] in found:
                    ranked.append((r, s[:k], s[k:]))
        ranked.sort()
        return _engine(self.vocab, found, [(a, b) for _, a, b in ranked], self.pre)
