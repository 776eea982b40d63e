"""Fill-in-the-middle prompts from a model's FIM tokens, laid out as llama.cpp's server
lays out /infill (prefix-suffix-middle):

    [BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid>   ->   the model writes the middle

Ollama's `suffix` on /api/generate and OpenAI's on /v1/completions use it. A model whose
GGUF names no FIM tokens (`tokenizer.ggml.fim_pre_token_id`, ... or llama.cpp's known
token texts) cannot do it: a clear error, never a prompt that ignores the suffix.
"""

from __future__ import annotations

from llamay.errors import RequestError
from llamay.tok.vocab import FIM_TEXTS

FIM_SLOTS = ("fim_pre", "fim_suf", "fim_mid")
_OLD_KEYS = {"fim_pre": "prefix", "fim_suf": "suffix", "fim_mid": "middle"}


def gguf_has_fim(meta: dict) -> bool:
    """Whether GGUF metadata names the three FIM tokens (by key, or by the token texts
    llama.cpp recognises), without building a tokenizer: Ollama's "insert" capability."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    texts = set(tokens) if isinstance(tokens, list) else set()
    for slot in FIM_SLOTS:
        keys = (f"tokenizer.ggml.{slot}_token_id", f"tokenizer.ggml.{_OLD_KEYS[slot]}_token_id")
        if not any(isinstance(meta.get(k), int) for k in keys) and not texts & set(FIM_TEXTS[slot]):
            return False
    return True


def fim_tokens(lm) -> tuple[int, int, int]:
    """The model's (prefix, suffix, middle) token ids, or RequestError naming what is
    missing."""
    special = lm.model.tokenizer.vocab.special
    ids = [special.get(k) for k in FIM_SLOTS]
    missing = [k for k, i in zip(FIM_SLOTS, ids, strict=True) if i is None]
    if missing:
        raise RequestError(
            f"model {lm.name!r} does not support insert (fill-in-the-middle, suffix): its "
            f"GGUF names no {', '.join(missing)} token (tokenizer.ggml.<name>_token_id); use "
            "a code model with FIM tokens, or send the prompt without a suffix"
        )
    return ids[0], ids[1], ids[2]


def fim_ids(lm, prefix: str, suffix: str) -> list[int]:
    """Token ids of the fill-in-the-middle prompt for `prefix` ... `suffix` (blocking:
    tokenises; run it with `core.off_loop`)."""
    pre, suf, mid = fim_tokens(lm)
    model = lm.model
    vocab = model.tokenizer.vocab
    head = [vocab.special["bos"]] if vocab.add_bos and vocab.special.get("bos") is not None else []
    a = model.tokenize(prefix, add_special=False, parse_special=False) if prefix else []
    b = model.tokenize(suffix, add_special=False, parse_special=False) if suffix else []
    return [*head, pre, *a, suf, *b, mid]
