"""The vocabulary as llama.cpp loads it from GGUF metadata (`llama_vocab::impl::load`).

Everything that decides token ids and their rendering lives here: the tokenizer kind, the
per-kind defaults for special ids and flags, the token attributes (with llama.cpp's
text-based fix-ups), the end-of-generation set, and the ordered list of special tokens
that the partitioner splits out of raw text.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from llamay.errors import TokenizerError, UnsupportedTokenizerError
from llamay.tok.pretokenize import PreSpec, pre_spec

# llama_token_attr bits
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_NORMALIZED = 1 << 6
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8
ATTR_SINGLE_WORD = 1 << 9

# GGUF tokenizer.ggml.token_type values
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL = 0, 1, 2, 3
TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 4, 5, 6

_TYPE_TO_ATTR = np.array(
    [
        ATTR_UNDEFINED,
        ATTR_NORMAL,
        ATTR_UNKNOWN,
        ATTR_CONTROL,
        ATTR_USER_DEFINED,
        ATTR_UNUSED,
        ATTR_BYTE,
    ],
    dtype=np.int32,
)

KIND_SPM, KIND_BPE, KIND_WPM = "spm", "bpe", "wpm"

_UNSUPPORTED_MODELS = {
    "t5": "the Unigram (UGM) tokenizer",
    "rwkv": "the RWKV tokenizer",
    "plamo2": "the PLaMo-2 tokenizer",
    "gemma4": "SentencePiece-style BPE over raw UTF-8 (Gemma 4)",
    "hybriddna": "the hybrid DNA tokenizer",
    "whitespace": "the whitespace tokenizer",
}

# Tokens llama.cpp recognises by their text (see the comments in llama-vocab.cpp:
# "this is currently determined based on the token text, which is obviously not ideal").
EOT_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|end_of_text|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    }
)
EOM_TEXTS = frozenset({"<|eom_id|>"})
FIM_TEXTS = {
    "fim_pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<|flush|>",
        "<|calls|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "</s>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "[EOT]",
        "[EOS]",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<eos>",
        "<turn|>",
        "<|tool_response>",
        "<｜end▁of▁sentence｜>",
        "[e~[",
    }
)
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# metadata key suffix -> special slot ("seperator" is GGUF's spelling)
_SPECIAL_KEYS = (
    ("bos_token_id", "bos"),
    ("eos_token_id", "eos"),
    ("eot_token_id", "eot"),
    ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"),
    ("seperator_token_id", "sep"),
    ("padding_token_id", "pad"),
    ("mask_token_id", "mask"),
    ("fim_pre_token_id", "fim_pre"),
    ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"),
    ("fim_pad_token_id", "fim_pad"),
    ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"),
    ("prefix_token_id", "fim_pre"),  # deprecated spellings
    ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)


@dataclass
class Vocab:
    """Tokenizer data from GGUF metadata, with llama.cpp's defaults and fix-ups applied."""

    model: str  # tokenizer.ggml.model
    kind: str  # KIND_SPM | KIND_BPE | KIND_WPM
    pre: str | None
    pre_spec: PreSpec | None
    tokens: list[str]
    token_to_id: dict[str, int]
    scores: np.ndarray  # float32, zeros when the GGUF has none
    attrs: np.ndarray  # int32 llama_token_attr bits
    merges: list[str] | None
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    escape_whitespaces: bool = True
    ignore_merges: bool = False
    lowercase: bool = True  # WordPiece normaliser
    strip_accents: bool = True
    eog_ids: frozenset[int] = frozenset()
    special_ids: tuple[int, ...] = ()  # partition order: longest text first
    architecture: str | None = None
    chat_template: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @cached_property
    def max_token_len(self) -> int:
        """Code points in the longest token text."""
        return max(map(len, self.tokens))

    def tokens_in(self, texts) -> dict[str, int]:
        """Every token whose text is a substring of one of `texts`: text -> id.

        The tokens a merge-based encoder can produce from `texts` are among these, which
        lets `spm`/`bpe` build engines of a few thousand entries for one text."""
        get = self.token_to_id.get
        longest = self.max_token_len
        found: dict[str, int] = {}
        for text in set(texts):
            n = len(text)
            for i in range(n):
                for j in range(i + 1, min(n, i + longest) + 1):
                    s = text[i:j]
                    t = get(s)
                    if t is not None:
                        found[s] = t
        return found

    def has_attr(self, token_id: int, attr: int) -> bool:
        return bool(int(self.attrs[token_id]) & attr)

    @classmethod
    def from_metadata(cls, meta: dict) -> Vocab:
        return _load(meta)


def _bool(meta: dict, key: str, default: bool) -> bool:
    v = meta.get(key)
    return default if v is None else bool(v)


def _load(meta: dict) -> Vocab:
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise TokenizerError("GGUF has no tokenizer.ggml.model: the file carries no tokenizer")
    if not isinstance(model, str):
        raise TokenizerError(f"tokenizer.ggml.model must be a string, got {model!r}")
    pre = meta.get("tokenizer.ggml.pre")

    special: dict[str, int | None] = {s: None for _, s in _SPECIAL_KEYS}
    merges = None
    spec = None
    if model == "llama":
        kind = KIND_SPM
        special.update(bos=1, eos=2, unk=0)
        add_bos, add_eos, add_sep, add_space_prefix, clean = True, False, False, True, False
        escape, ignore = True, False
    elif model == "bert":
        kind = KIND_WPM
        special.update(bos=101, unk=100, sep=102, pad=0, mask=103)
        add_bos, add_eos, add_sep, add_space_prefix, clean = True, False, True, False, True
        escape, ignore = True, False
    elif model == "gpt2":
        kind = KIND_BPE
        merges = meta.get("tokenizer.ggml.merges")
        if merges is None:
            raise TokenizerError(
                "tokenizer.ggml.model is 'gpt2' but tokenizer.ggml.merges is missing"
            )
        if not isinstance(merges, list):
            raise TokenizerError("tokenizer.ggml.merges must be an array of strings")
        spec = pre_spec(pre)
        special.update(bos=11, eos=11)
        add_bos, add_eos, add_sep = spec.add_bos, False, spec.add_sep
        add_space_prefix, clean, escape, ignore = (
            False,
            spec.clean_spaces,
            False,
            spec.ignore_merges,
        )
        if spec.no_bos:
            special["bos"] = None
    elif model in ("no_vocab", "none"):
        raise TokenizerError(f"tokenizer.ggml.model = {model!r}: this model has no vocabulary")
    elif model in _UNSUPPORTED_MODELS:
        raise UnsupportedTokenizerError(
            f"tokenizer.ggml.model = {model!r} ({_UNSUPPORTED_MODELS[model]}) is not supported "
            "by llamay; supported: 'llama' (SentencePiece), 'gpt2' (byte-level BPE), 'bert'"
        )
    else:
        raise UnsupportedTokenizerError(
            f"unknown tokenizer model tokenizer.ggml.model = {model!r}; "
            "supported: 'llama', 'gpt2', 'bert'"
        )
    add_space_prefix = _bool(meta, "tokenizer.ggml.add_space_prefix", add_space_prefix)

    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise TokenizerError("GGUF has no tokenizer.ggml.tokens (or it is empty)")
    n = len(tokens)
    if not all(tokens):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    token_to_id = dict(zip(tokens, range(n), strict=True))
    if len(token_to_id) != n:
        first: dict[str, int] = {}
        for i, t in enumerate(tokens):
            j = first.setdefault(t, i)
            if j != i:
                raise TokenizerError(f"duplicate token in vocabulary: {t!r} has ids {j} and {i}")

    scores = meta.get("tokenizer.ggml.scores")
    if scores is None:
        scores = np.zeros(n, np.float32)
    else:
        scores = np.asarray(scores)
        if scores.ndim != 1 or len(scores) < n or scores.dtype.kind not in "fi":
            raise TokenizerError(
                f"tokenizer.ggml.scores must be a float/int array of at least {n} entries"
            )
        scores = scores[:n].astype(np.float32)

    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        attrs = np.full(n, ATTR_NORMAL, np.int32)
    else:
        types = np.asarray(types)
        if types.ndim != 1 or len(types) < n or types.dtype.kind not in "iu":
            raise TokenizerError(
                f"tokenizer.ggml.token_type must be an int array of at least {n} entries"
            )
        types = types[:n].astype(np.int64)
        attrs = np.where(
            (types >= 0) & (types <= 6), _TYPE_TO_ATTR[np.clip(types, 0, 6)], ATTR_UNDEFINED
        ).astype(np.int32)

    # special ids: defaults out of range are disabled; metadata overrides when in range
    for key, slot in _SPECIAL_KEYS:
        cur = special[slot]
        if cur is not None and cur >= n:
            special[slot] = None
        v = meta.get("tokenizer.ggml." + key)
        if v is None:
            continue
        v = int(v)
        if 0 <= v < n:
            special[slot] = v
        else:
            warnings.warn(
                f"bad special token: tokenizer.ggml.{key} = {v} is outside the vocabulary "
                f"(size {n}); using default {special[slot]}",
                stacklevel=3,
            )

    add_bos = _bool(meta, "tokenizer.ggml.add_bos_token", add_bos)
    add_eos = _bool(meta, "tokenizer.ggml.add_eos_token", add_eos)
    add_sep = _bool(meta, "tokenizer.ggml.add_sep_token", add_sep)
    for flag, slot, name in (
        (add_bos, "bos", "add_bos_token"),
        (add_eos, "eos", "add_eos_token"),
        (add_sep, "sep", "add_sep_token"),
    ):
        if flag and special[slot] is None:
            raise TokenizerError(
                f"tokenizer.ggml.{name} is true, but the {slot.upper()} token id is not set"
            )

    lowercase = _bool(meta, "tokenizer.ggml.normalizer.lowercase", True)
    strip_accents = _bool(meta, "tokenizer.ggml.normalizer.strip_accents", lowercase)

    _fix_attrs_by_text(tokens, token_to_id, attrs, special)
    eog = _eog_ids(tokens, token_to_id, attrs, special)

    is_special = (attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) != 0
    special_ids = [int(i) for i in np.nonzero(is_special)[0]]
    special_ids.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogatepass")))

    _per_model_attrs(meta, pre, tokens, token_to_id, attrs, special_ids)

    return Vocab(
        model=model,
        kind=kind,
        pre=pre,
        pre_spec=spec,
        tokens=tokens,
        token_to_id=token_to_id,
        scores=scores,
        attrs=attrs,
        merges=merges,
        special=special,
        add_bos=add_bos,
        add_eos=add_eos,
        add_sep=add_sep,
        add_space_prefix=add_space_prefix,
        clean_spaces=clean,
        escape_whitespaces=escape,
        ignore_merges=ignore,
        lowercase=lowercase,
        strip_accents=strip_accents,
        eog_ids=frozenset(eog),
        special_ids=tuple(special_ids),
        architecture=meta.get("general.architecture"),
        chat_template=meta.get("tokenizer.chat_template"),
    )


def _fix_attrs_by_text(tokens, token_to_id, attrs, special) -> None:
    """Auto-detect EOT/EOM/FIM tokens by text, marking them CONTROL; flag unused controls.

    When several candidate texts are present the lowest id wins (llama.cpp takes whichever
    its hash map yields first)."""

    def detect(slot: str, texts) -> None:
        if special[slot] is not None:
            return
        found = [token_to_id[t] for t in texts if t in token_to_id]
        if found:
            i = min(found)
            special[slot] = i
            attrs[i] |= ATTR_CONTROL

    detect("eot", EOT_TEXTS)
    detect("eom", EOM_TEXTS)
    for slot, texts in FIM_TEXTS.items():
        detect(slot, texts)
    for i in np.nonzero(attrs & ATTR_CONTROL)[0].tolist():
        if "unused" in tokens[i]:
            attrs[i] |= ATTR_UNUSED


def _eog_ids(tokens, token_to_id, attrs, special) -> set[int]:
    """The end-of-generation set, as llama.cpp builds `special_eog_ids`."""
    eog: set[int] = set()
    for slot in ("fim_pad", "fim_rep", "fim_sep"):
        if special[slot] is not None:
            eog.add(special[slot])
    for t in EOG_TEXTS:
        i = token_to_id.get(t)
        if i is not None:
            eog.add(i)
            attrs[i] |= ATTR_CONTROL
    for t in _ALWAYS_USER_DEFINED:  # gpt-oss: always rendered
        i = token_to_id.get(t)
        if i is not None:
            attrs[i] = ATTR_USER_DEFINED
    for slot in ("eos", "eot", "eom"):
        if special[slot] is not None:
            eog.add(special[slot])
    texts = {tokens[i]: i for i in eog}
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        end = texts["<|end|>"]
        eog.discard(end)
        attrs[end] = ATTR_USER_DEFINED
    if "<|tool_response>" in texts and "</s>" in texts:
        s = texts["</s>"]
        eog.discard(s)
        attrs[s] = ATTR_NORMAL
    return eog


def _per_model_attrs(meta, pre, tokens, token_to_id, attrs, special_ids) -> None:
    """llama.cpp's per-model LSTRIP/RSTRIP attributes (chosen by name, pre or architecture)."""
    name = str(meta.get("general.name") or "").lower()
    arch = str(meta.get("general.architecture") or "")
    pre = pre or ""

    def set_attr(text: str, attr: int, value: bool) -> None:
        i = token_to_id.get(text)
        if i is not None:
            attrs[i] = (attrs[i] | attr) if value else (attrs[i] & ~attr)

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", ATTR_LSTRIP, True)
    elif "phi-3" in name or "phi3" in name:
        for i in special_ids:
            attrs[i] |= ATTR_RSTRIP
        set_attr("</s>", ATTR_RSTRIP, True)
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(t, ATTR_RSTRIP, False)
    elif "modern-bert" in name:
        set_attr("[MASK]", ATTR_LSTRIP, True)
