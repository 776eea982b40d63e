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
    from tokenizers import Tokenizer
    from tokenizers.models import BPE

    assert vocab.pre_spec is not None and vocab.merges is not None
    merges = parse_merges(vocab.merges, vocab.token_to_id)
    model = BPE(vocab.token_to_id, merges, ignore_merges=vocab.ignore_merges)
    tk = Tokenizer(model)
    tk.pre_tokenizer = pre_tokenizer(vocab.pre_spec, byte_level=True)
    return tk
