"""Pre-tokenizer regexes per `tokenizer.ggml.pre`, as llama.cpp splits text before BPE.

llama.cpp applies a list of regexes in order; each regex splits every current piece into
its matches and the gaps between them (both kept, in order). That is the `tokenizers`
`Split(pattern, behavior="isolated")` pre-tokenizer applied in sequence, which is what
`pre_tokenizer()` builds.

llama.cpp evaluates most regexes with `std::regex` on a "collapsed" copy of the text in
which every non-ASCII code point is replaced by one byte standing for its Unicode
category. The translation below (`to_onig`) reproduces the two consequences that differ
from a Unicode-aware engine: `\\p{Lu}`/`\\p{Ll}`/... all mean "letter" (case is only known
for ASCII), and `\\p{S}` does not contain ASCII `~`. `\\d` and `\\b` are ASCII-only there.

Known residual differences (edge cases, documented rather than emulated): code points
that llama.cpp's tables leave undefined (unassigned, noncharacters) are never matched by
`[^\\s\\p{L}\\p{N}]` in llama.cpp's hand-written GPT-2/Llama-3 splitters; the Unicode
versions of the two category tables may differ for very new characters; and for the
`deepseek-llm` set, U+3000 inside a literal range is seen as whitespace by llama.cpp.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

from llamay.errors import UnsupportedTokenizerError

# --- regex building blocks (patterns as llama.cpp's llm_tokenizer_bpe lists them) ------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# GPT-2: llama.cpp's hand-written splitter also implements the final `\s+` alternative.
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
    r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
# Non-ASCII literals are written as escapes: several of these code points (e.g. U+1FD3,
# U+2126, U+212A) are changed by Unicode normalisation and must not be edited as text.
_DEEPSEEK_LETTERS = (  # Unicode "cased letter" ranges, as in DeepSeek's tokenizer.json
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[" + _DEEPSEEK_LETTERS + r"]+",
    r"\s?[!-/:-~" + "\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002" + r"]+",
    r"\s+$",
    _CJK_HANGUL,
    r"\p{N}+",
]
DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}"]
_PUNCT_WORD = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
)
DEEPSEEK3 = [
    r"\p{N}{1,3}",
    _CJK_KANA,
    _PUNCT_WORD + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
SPARK2_5 = [
    r"\p{N}{1,3}",
    _CJK_KANA,
    _PUNCT_WORD + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
]
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
YOUTU = [
    "[\uac00-\ud7a3\u3131-\u318e]+"
    "|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+"
    "|[\u3105-\u312f]+|" + _CJK_KANA,
    r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?" + _UPPER + "+" + _LOWER + "*" + _CONTRACTIONS + "?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"]
BLOOM = [r" ?[^(\s|.,!?" + "\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c" + ")]+"]
VIKING = [BLOOM[0], r"\p{N}"]
# llama.cpp's rewrite of the tekken/gpt-4o regexes: `(?=[\p{L}])([^a-z])` stands for an
# upper-case letter, which on its collapsed text means "ASCII upper or any non-ASCII letter".
_UP = r"((?=[\p{L}])([^a-z]))"
_LO = r"((?=[\p{L}])([^A-Z]))"
TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?" + _UP + "*" + _LO + "+"
    r"|[^\r\n\p{L}\p{N}]?" + _UP + "+" + _LO + "*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O = (
    r"[^\r\n\p{L}\p{N}]?" + _UP + "*" + _LO + "+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?" + _UP + "+" + _LO + "*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPM = r"((?=[\p{L}\p{M}])([^a-z]))"
_LOM = r"((?=[\p{L}\p{M}])([^A-Z]))"
GRANITE_EMB_MULTI = (
    r"[^\r\n\p{L}\p{N}]?" + _UPM + "*" + _LOM + "+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?" + _UPM + "+" + _LOM + "*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TINY_AYA = [
    r"\d{1,3}(?=(?:\d{3})*\b)",
    r"[^\r\n\p{L}\p{N}]?" + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + "?"
    r"|[^\r\n\p{L}\p{N}]?" + _UPPER + "+" + _LOWER + "*" + _CONTRACTIONS + "?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
CHAMELEON = [
    r"<sentinel:[0-9]+>",
    r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    r"([\t\n]|    |  )",
    r"\p{N}",
    r"[\p{P}!-/:-@\[-`{-~]",
    GPT2,
]
BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
SEED_CODER = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
EXAONE_MOE = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"
)
MINICPM5 = [
    r"\p{N}{1,3}",
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
]
SUPERBPE = [r"\p{N}+", r"(?=(\d{3})+(?!\d))"]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]


@dataclass(frozen=True)
class PreSpec:
    """How llama.cpp pre-processes text for one `tokenizer.ggml.pre` value."""

    name: str
    regexes: tuple[str, ...]
    clean_spaces: bool = True  # llama.cpp's detokenizer clean-up (BPE default: on)
    ignore_merges: bool = False  # a whole pre-token found in the vocab is emitted as is
    add_bos: bool = False  # default for tokenizer.ggml.add_bos_token
    add_sep: bool = False
    no_bos: bool = False  # the default BOS id is disabled (chatglm)


def _spec(names, regexes, **kw) -> dict[str, PreSpec]:
    regexes = (regexes,) if isinstance(regexes, str) else tuple(regexes)
    return {n: PreSpec(n, regexes, **kw) for n in names}


_NC = {"clean_spaces": False}
PRE_TYPES: dict[str, PreSpec] = {
    **_spec(["default"], DEFAULT),
    **_spec(["minicpm5"], MINICPM5, ignore_merges=True),
    **_spec(
        [
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        LLAMA3,
        ignore_merges=True,
        add_bos=True,
    ),
    **_spec(["dbrx", "smaug-bpe"], LLAMA3),
    **_spec(["deepseek-llm"], DEEPSEEK_LLM, **_NC),
    **_spec(["deepseek-coder"], DEEPSEEK_CODER, **_NC),
    **_spec(["deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"], DEEPSEEK3, **_NC),
    **_spec(["spark2_5"], SPARK2_5, **_NC),
    **_spec(["youtu"], YOUTU, clean_spaces=False, ignore_merges=True),
    **_spec(["falcon"], FALCON),
    **_spec(
        [
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
        ],
        GPT2,
    ),
    **_spec(["trillion", "granite-docling"], GPT2, **_NC),
    **_spec(["jina-v1-en", "jina-v2-code", "roberta-bpe"], GPT2, add_sep=True),
    **_spec(["jais-2"], JAIS2),
    **_spec(
        ["starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"],
        [r"\p{N}", GPT2],
    ),
    **_spec(["command-r", "smollm"], [r"\p{N}", GPT2], **_NC),
    **_spec(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], QWEN2, **_NC),
    **_spec(["megrez", "stablelm2"], QWEN2),
    **_spec(["hunyuan", "solar-open", "grok-2"], QWEN2, **_NC),
    **_spec(["qwen35"], QWEN35, **_NC),
    **_spec(["poro-chat"], BLOOM, **_NC),
    **_spec(["bloom", "gpt3-finnish"], BLOOM),
    **_spec(["glm4", "chatglm-bpe"], LLAMA3, no_bos=True),
    **_spec(["viking"], VIKING, **_NC),
    **_spec(["tekken"], TEKKEN, clean_spaces=False, ignore_merges=True, add_bos=True),
    **_spec(["chameleon"], CHAMELEON, clean_spaces=False, add_bos=True),
    **_spec(["exaone-moe"], EXAONE_MOE),
    **_spec(["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"], GPT4O, **_NC),
    **_spec(["granite-embed-multi-97m"], GRANITE_EMB_MULTI, clean_spaces=False, ignore_merges=True),
    **_spec(["tiny_aya", "cohere2moe"], TINY_AYA, **_NC),
    **_spec(["superbpe"], SUPERBPE, **_NC),
    **_spec(["bailingmoe", "bailingmoe2", "llada-moe"], BAILINGMOE, **_NC),
    **_spec(["seed-coder"], SEED_CODER, **_NC),
    **_spec(["ufakzeka"], UFAKZEKA, **_NC),
    **_spec(["laguna"], [r"[^\n]+|[\n]+", QWEN2], **_NC),
}

# Known to llama.cpp but built on tokenizer code llamay does not reproduce (yet).
UNSUPPORTED_PRE: dict[str, str] = {
    "kimi-k2": "uses llama.cpp's hand-written Kimi-K2 splitter and has no BPE merges",
    "afmoe": "uses llama.cpp's hand-written AFMoE digit splitter",
    "gemma4": "SentencePiece-style BPE over raw UTF-8 is not implemented",
    "granite-embed-multi-311m": "SentencePiece-style BPE over raw UTF-8 is not implemented",
    "sarvam-moe": "SentencePiece-style BPE over raw UTF-8 is not implemented",
    "whitespace": "the whitespace tokenizer is not implemented",
}


def pre_spec(pre: str | None) -> PreSpec:
    """The `PreSpec` for a `tokenizer.ggml.pre` value, failing clearly on unknown ones.

    A missing value falls back to `default`, as llama.cpp does (with a warning)."""
    if not pre:
        warnings.warn(
            "GGUF has no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer "
            "(tokenisation quality may be degraded; consider regenerating the model)",
            stacklevel=3,
        )
        return PRE_TYPES["default"]
    if pre in UNSUPPORTED_PRE:
        raise UnsupportedTokenizerError(
            f"tokenizer.ggml.pre = {pre!r} is not supported by llamay: {UNSUPPORTED_PRE[pre]}"
        )
    try:
        return PRE_TYPES[pre]
    except KeyError:
        known = ", ".join(sorted(PRE_TYPES))
        raise UnsupportedTokenizerError(
            f"unknown pre-tokenizer tokenizer.ggml.pre = {pre!r} (llama.cpp rejects it too); "
            f"known values: {known}"
        ) from None


_LETTER_CLASSES = re.compile(r"\\p\{L[ultmo]\}")
_WORD = "[A-Za-z0-9_]"


def to_onig(regex: str) -> str:
    """Rewrite a llama.cpp pre-tokenizer regex for Oniguruma with llama.cpp's semantics."""
    out = _LETTER_CLASSES.sub(r"\\p{L}", regex)
    out = out.replace(r"\p{S}", r"[\p{S}&&[^~]]")
    out = out.replace(r"\d", "[0-9]")
    out = out.replace(
        r"\b", f"(?:(?<={_WORD})(?!{_WORD})|(?<!{_WORD})(?={_WORD}))"
    )  # ASCII word boundary
    if out.endswith("$"):
        out = out[:-1] + r"\z"
    return out


def pre_tokenizer(spec: PreSpec, byte_level: bool = True):
    """The `tokenizers` pre-tokenizer for `spec` (regex splits, then GPT-2 byte mapping)."""
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    steps = [pt.Split(Regex(to_onig(r)), behavior="isolated") for r in spec.regexes]
    if byte_level:
        steps.append(pt.ByteLevel(add_prefix_space=False, use_regex=False))
    return pt.Sequence(steps)
