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

FIM_ROLES = ("pre", "suf", "mid", "rep", "sep")
#: the roles a FIM prompt needs, and the older GGUF key names of their tokens
REQUIRED_ROLES = {"pre": "prefix", "suf": "suffix", "mid": "middle"}


def gguf_has_fim(meta: dict) -> bool:
    """Whether GGUF metadata names the three FIM tokens (by key, or by the token texts
    llama.cpp recognises), without building a tokenizer: Ollama's "insert" capability."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    texts = set(tokens) if isinstance(tokens, list) else set()
    for role, old in REQUIRED_ROLES.items():
        keys = (f"tokenizer.ggml.fim_{role}_token_id", f"tokenizer.ggml.{old}_token_id")
        if not any(isinstance(meta.get(k), int) for k in keys) and not texts & set(
            FIM_TEXTS[f"fim_{role}"]
        ):
            return False
    return True


def fim_token_ids(lm) -> dict[str, int | None]:
    """The model's FIM token ids by role: pre, suf, mid (the three a FIM prompt needs),
    rep and sep (repository-level context, where the model has them)."""
    special = lm.model.tokenizer.vocab.special
    return {role: special.get(f"fim_{role}") for role in FIM_ROLES}


def missing_roles(ids: dict[str, int | None]) -> list[str]:
    """The required FIM roles (pre, suf, mid) the model has no token for."""
    return [role for role in REQUIRED_ROLES if ids[role] is None]


def layout(lm, ids: dict[str, int | None], prefix: list[int], suffix: list[int]) -> list[int]:
    """[BOS] <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID>, over token ids."""
    vocab = lm.model.tokenizer.vocab
    head = [vocab.special["bos"]] if vocab.add_bos and vocab.special.get("bos") is not None else []
    return [*head, ids["pre"], *prefix, ids["suf"], *suffix, ids["mid"]]


def fim_ids(lm, prefix: str, suffix: str) -> list[int]:
    """Token ids of the fill-in-the-middle prompt for `prefix` ... `suffix`, or
    RequestError naming the tokens the model lacks (blocking: tokenises; run it with
    `core.off_loop`)."""
    ids = fim_token_ids(lm)
    missing = missing_roles(ids)
    if missing:
        raise RequestError(
            f"model {lm.name!r} does not support insert (fill-in-the-middle, suffix): its "
            f"GGUF names no {', '.join(f'fim_{r}' for r in missing)} token "
            "(tokenizer.ggml.<name>_token_id); use a code model with FIM tokens, or send the "
            "prompt without a suffix"
        )
    model = lm.model
    a = model.tokenize(prefix, add_special=False, parse_special=False) if prefix else []
    b = model.tokenize(suffix, add_special=False, parse_special=False) if suffix else []
    return layout(lm, ids, a, b)
