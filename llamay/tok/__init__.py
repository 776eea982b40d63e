"""Tokenizers built from GGUF metadata, matching llama.cpp token for token.

    tok = Tokenizer.from_metadata(open_gguf(path).metadata)
    ids = tok.encode(text, add_special=True, parse_special=False)
    text = tok.decode(ids, skip_special=False)

Modules: `vocab` (llama.cpp's load rules), `pretokenize` (regexes per
`tokenizer.ggml.pre`), `special` (special-token partition), `bpe`/`spm`/`wordpiece` (the
`tokenizers` engines), `detok` (pieces, detokenisation, streaming), `chat` (templates).
"""

from llamay.tok.chat import BUILTIN_TEMPLATES, builtin_template_for, render_chat
from llamay.tok.detok import IncrementalDecoder, StopStrings
from llamay.tok.pretokenize import PRE_TYPES
from llamay.tok.tokenizer import Tokenizer
from llamay.tok.vocab import Vocab

__all__ = [
    "BUILTIN_TEMPLATES",
    "IncrementalDecoder",
    "PRE_TYPES",
    "StopStrings",
    "Tokenizer",
    "Vocab",
    "builtin_template_for",
    "render_chat",
]
