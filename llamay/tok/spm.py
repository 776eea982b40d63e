"""SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`) on the `tokenizers` BPE engine.

llama.cpp does not run SentencePiece's unigram Viterbi: it splits the text into UTF-8
characters and repeatedly merges the adjacent pair whose concatenation is a vocabulary
token of highest score (leftmost first on ties), then emits each final symbol's id, or
its `<0xXX>` byte tokens when the symbol is not a token.

That is BPE with merges derived from the scores: for every token `t` and every split
`t = a + b` with `a` and `b` both tokens, a merge `(a, b) -> t` ranked by `t`'s score.
Ties are the one thing `tokenizers` cannot express: its ranks are unique, so two
*different* tokens of exactly equal score compete by token id instead of by position
(Gemma's normal tokens all have distinct scores; its byte, control and user-defined
tokens share scores but are only reachable from literal text like `<0x41>`).

Finding the splits for a 262k vocabulary is done with vectorised 64-bit polynomial
hashes of all prefixes/suffixes and a sorted-hash lookup; a hit counts only when a second,
independent hash and the lengths agree too.
"""

from __future__ import annotations

import numpy as np

from llamay.tok.vocab import Vocab

_P1 = 0x100000001B3  # two independent 64-bit polynomial hashes
_P2 = 0x9E3779B97F4A7C15


def _prefix_hashes(codes, starts, lengths, base: int) -> np.ndarray:
    """g[starts[t] + k] = hash of the first k + 1 code points of token t (mod 2**64)."""
    g = np.empty(len(codes), np.uint64)
    p = np.uint64(base)
    g[starts] = codes[starts]
    live = np.nonzero(lengths > 1)[0]
    k = 1
    while len(live):
        idx = starts[live] + k
        g[idx] = g[idx - 1] * p + codes[idx]
        k += 1
        live = live[lengths[live] > k]
    return g


def _hash_fns(codes, starts, ends, lengths, base: int):
    g = _prefix_hashes(codes, starts, lengths, base)
    pw = np.empty(int(lengths.max()) + 1, np.uint64)
    pw[0] = 1
    for i in range(1, len(pw)):
        pw[i] = pw[i - 1] * np.uint64(base)
    full = g[ends - 1]

    def prefix(s, cut):  # hash of [s, cut), cut > s
        return g[cut - 1]

    def suffix(s, cut, e):  # hash of [cut, e), e > cut > s
        return g[e - 1] - g[cut - 1] * pw[e - cut]

    return full, prefix, suffix


def split_pairs(tokens: list[str]) -> np.ndarray:
    """All (t, a, b) with tokens[t] == tokens[a] + tokens[b], as an int64 array [N, 3].

    Two independent 64-bit hashes and the lengths must all agree for a pair to count."""
    n_tok = len(tokens)
    lengths = np.fromiter((len(t) for t in tokens), np.int64, n_tok)
    if n_tok == 0 or lengths.min() < 1:
        return _split_pairs_slow(tokens)
    try:
        flat = np.frombuffer("".join(tokens).encode("utf-32-le"), np.uint32)
    except UnicodeEncodeError:  # lone surrogates: fall back to the slow, exact path
        return _split_pairs_slow(tokens)
    codes = flat.astype(np.uint64) + np.uint64(1)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    multi = np.nonzero(lengths >= 2)[0]
    n_cuts = lengths[multi] - 1
    t_ids = np.repeat(multi, n_cuts)
    first_cut = np.repeat(np.cumsum(n_cuts) - n_cuts, n_cuts)
    cut = starts[t_ids] + np.arange(len(t_ids), dtype=np.int64) - first_cut + 1
    s, e = starts[t_ids], ends[t_ids]
    with np.errstate(over="ignore"):
        full1, prefix1, suffix1 = _hash_fns(codes, starts, ends, lengths, _P1)
        order = np.argsort(full1)
        sorted1 = full1[order]

        def lookup(h: np.ndarray) -> np.ndarray:
            pos = np.minimum(np.searchsorted(sorted1, h), n_tok - 1)
            return np.where(sorted1[pos] == h, order[pos], -1)

        a = lookup(prefix1(s, cut))
        ok = np.nonzero(a >= 0)[0]
        b = lookup(suffix1(s[ok], cut[ok], e[ok]))
        keep = b >= 0
        ok, a, b = ok[keep], a[ok][keep], b[keep]
        t, s, e, cut = t_ids[ok], s[ok], e[ok], cut[ok]
        full2, prefix2, suffix2 = _hash_fns(codes, starts, ends, lengths, _P2)
        good = (
            (full2[a] == prefix2(s, cut))
            & (full2[b] == suffix2(s, cut, e))
            & (lengths[a] == cut - s)
            & (lengths[b] == e - cut)
        )
    return np.stack([t[good], a[good], b[good]], axis=1)


def _split_pairs_slow(tokens: list[str]) -> np.ndarray:
    get = {t: i for i, t in enumerate(tokens)}.get
    out = []
    for i, t in enumerate(tokens):
        for k in range(1, len(t)):
            a = get(t[:k])
            if a is not None:
                b = get(t[k:])
                if b is not None:
                    out.append((i, a, b))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def derive_merges(vocab: Vocab) -> list[tuple[str, str]]:
    """BPE merges reproducing llama.cpp's score-driven bigram merging, best first."""
    triples = split_pairs(vocab.tokens)
    if not len(triples):
        return []
    t = triples[:, 0]
    # highest score first; among equal scores by token id (see the module docstring)
    order = np.lexsort((t, -vocab.scores[t].astype(np.float64)))
    triples = triples[order]
    toks = np.array(vocab.tokens, dtype=object)
    return list(zip(toks[triples[:, 1]].tolist(), toks[triples[:, 2]].tolist(), strict=True))


def build_spm(vocab: Vocab):
    """A `tokenizers.Tokenizer` mapping one whitespace-escaped fragment to llama.cpp's ids."""
    return _engine(vocab.token_to_id, derive_merges(vocab))


def _engine(token_to_id: dict[str, int], merges: list[tuple[str, str]]):
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    return Tokenizer(BPE(token_to_id, merges, byte_fallback=True))


def build_spm_for(vocab: Vocab, pieces: list[str]):
    """The engine of `build_spm` cut down to what encoding `pieces` can touch.

    Every merge result is a substring of the piece being merged, so the tokens occurring
    as substrings of `pieces`, their merges in the full engine's order, and the
    byte-fallback tokens give the same ids as the full engine: a few thousand entries
    instead of 262k tokens and 0.5M merges."""
    found = vocab.tokens_in(pieces)
    scores = vocab.scores
    ranked = []  # (-score, token id, cut): derive_merges' order
    for s, t in found.items():
        for k in range(1, len(s)):
            if s[:k] in found and s[k:] in found:
                ranked.append((-float(scores[t]), t, k, s))
    ranked.sort()
    get = vocab.token_to_id.get
    for b in range(256):
        byte = f"<0x{b:02X}>"
        t = get(byte)
        if t is not None:
            found[byte] = t
    return _engine(found, [(s[:k], s[k:]) for _, _, k, s in ranked])
