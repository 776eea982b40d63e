"""`Tokenizer`: text <-> token ids with llama.cpp's semantics, built from GGUF metadata."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from llamay.errors import TokenizerError
from llamay.tok.chat import BUILTIN_TEMPLATES, builtin_template_for, render_chat
from llamay.tok.detok import IncrementalDecoder, Pieces, detokenize
from llamay.tok.special import SpecialSplitter
from llamay.tok.vocab import KIND_BPE, KIND_SPM, KIND_WPM, Vocab

# Characters encoded through per-text engines before building the full one: a subset
# engine costs ~30 us per character of its text (2 cores at load 4-8), so this much costs
# about what one full Gemma 3 build does.
SUBSET_BUDGET = 50_000


class Tokenizer:
    """A GGUF model's tokenizer.

    `encode`/`decode` reproduce llama.cpp's `llama_tokenize`/`llama_detokenize`. The
    `tokenizers` engine behind `encode` is built only when needed, so constructing a
    `Tokenizer` to read its special ids or to decode is cheap. Building the full engine of
    a merge-based vocabulary costs up to seconds (Gemma 3: 262k tokens and ~0.5M derived
    merges), so it is put off ski-rental style: the first `SUBSET_BUDGET` characters
    encoded each get a small engine of just the tokens their text contains (milliseconds
    for a prompt, same ids), and only past that budget, or on `warm()`, is the full one
    built. A server should `warm()` at load, before requests share the GIL with it.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self._pieces = Pieces(vocab)
        self._splitter: SpecialSplitter | None = None
        self._engine = None
        self._lock = threading.Lock()
        self._subset_budget = SUBSET_BUDGET if vocab.kind in (KIND_SPM, KIND_BPE) else 0
        self._subsets = None  # fragments -> engine for just those
        if vocab.chat_template:
            self.chat_template: str = vocab.chat_template
            self.chat_template_source = "gguf"
        else:
            name = builtin_template_for(vocab.architecture)
            self.chat_template = BUILTIN_TEMPLATES[name]
            self.chat_template_source = f"builtin:{name}"

    # --- construction -----------------------------------------------------------------

    @classmethod
    def from_metadata(cls, meta: dict) -> Tokenizer:
        """Build from a GGUF metadata dict (`llamay.gguf.open_gguf(path).metadata`)."""
        return cls(Vocab.from_metadata(meta))

    @classmethod
    def from_gguf(cls, path) -> Tokenizer:
        from llamay.gguf import open_gguf

        return cls.from_metadata(open_gguf(path).metadata)

    def _get_splitter(self) -> SpecialSplitter:
        sp = self._splitter
        if sp is None:
            with self._lock:
                if self._splitter is None:
                    self._splitter = SpecialSplitter(self.vocab)
                sp = self._splitter
        return sp

    def _get_engine(self):
        eng = self._engine
        if eng is None:
            with self._lock:
                if self._engine is None:
                    self._engine = self._build_engine()
                eng = self._engine
        return eng

    def _engine_for(self, frags: list[str]):
        """The full engine once built or once the subset budget is spent, else one for
        `frags` alone (none without text to encode)."""
        if not frags:
            return None
        if self._engine is None:
            n = sum(map(len, frags))
            with self._lock:
                subset = self._engine is None and n <= self._subset_budget
                if subset:
                    self._subset_budget -= n
                    if self._subsets is None:
                        self._subsets = self._build_subsets()
            if subset:
                return self._subsets(frags)
        return self._get_engine()

    def _build_subsets(self):
        if self.vocab.kind == KIND_SPM:
            from llamay.tok.spm import build_spm_for

            return partial(build_spm_for, self.vocab)
        from llamay.tok.bpe import BpeSubsets

        return BpeSubsets(self.vocab)

    def _build_engine(self):
        kind = self.vocab.kind
        if kind == KIND_BPE:
            from llamay.tok.bpe import build_bpe

            return build_bpe(self.vocab)
        if kind == KIND_SPM:
            from llamay.tok.spm import build_spm

            return build_spm(self.vocab)
        if kind == KIND_WPM:
            from llamay.tok.wordpiece import build_wordpiece

            return build_wordpiece(self.vocab)
        raise TokenizerError(f"no encoder for tokenizer kind {kind!r}")

    def warm(self) -> Tokenizer:
        """Build the full encoder now (otherwise `encode` does when it needs it)."""
        self._get_splitter()
        self._get_engine()
        return self

    # --- attributes -------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.vocab.n_tokens

    @property
    def model(self) -> str:
        return self.vocab.model

    @property
    def pre(self) -> str | None:
        return self.vocab.pre

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special["eot"]

    @property
    def eom_id(self) -> int | None:
        return self.vocab.special["eom"]

    @property
    def unk_id(self) -> int | None:
        return self.vocab.special["unk"]

    @property
    def pad_id(self) -> int | None:
        return self.vocab.special["pad"]

    @property
    def sep_id(self) -> int | None:
        return self.vocab.special["sep"]

    @property
    def eot_ids(self) -> frozenset[int]:
        """Ids that end generation (llama.cpp's EOG set: eos, eot, eom, FIM pad/repo/sep and
        known end-of-turn texts such as `<|im_end|>` and `<end_of_turn>`)."""
        return self.vocab.eog_ids

    stop_ids = eot_ids

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def id_to_token(self, token_id: int) -> str:
        return self.vocab.tokens[token_id]

    def token_to_id(self, text: str) -> int | None:
        return self.vocab.token_to_id.get(text)

    # --- encode -----------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.

        `add_special` adds BOS/EOS as the model asks (`tokenizer.ggml.add_bos_token`/
        `add_eos_token`, with llama.cpp's per-tokenizer defaults; BERT adds CLS and SEP);
        `parse_special` turns control-token text such as `<|im_start|>` into that token
        (user-defined tokens are always matched, as in llama.cpp)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:
                raise TokenizerError(
                    f"text is not valid Unicode (lone surrogate at position {e.start})"
                ) from None
        v = self.vocab
        frags = self._get_splitter().split(text, parse_special)
        out: list[int] = []
        kind = v.kind
        if add_special and (v.add_bos or kind == KIND_WPM):
            out.append(v.special["bos"])
        if kind == KIND_SPM:
            prev_special = True
            for k, f in enumerate(frags):
                if isinstance(f, str):
                    if v.add_space_prefix and prev_special:
                        f = " " + f
                    frags[k] = f.replace(" ", "▁")
                prev_special = not isinstance(f, str)
        elif kind == KIND_BPE and v.escape_whitespaces:
            frags = [f.replace(" ", "▁") if isinstance(f, str) else f for f in frags]
        eng = self._engine_for([f for f in frags if isinstance(f, str)])
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                # encode_batch lets go of the GIL while it works (encode holds it, ~1.3 s
                # per MB of text, stalling every other thread: a server's event loop too)
                out.extend(eng.encode_batch([f], add_special_tokens=False)[0].ids)
        if add_special:
            if kind == KIND_WPM:
                out.append(v.special["sep"])
            elif v.add_eos:
                out.append(v.special["eos"])
        return out

    def encode_batch(
        self, texts: Iterable[str], add_special: bool = True, parse_special: bool = False
    ) -> list[list[int]]:
        return [self.encode(t, add_special, parse_special) for t in texts]

    # --- decode -----------------------------------------------------------------------

    def token_to_piece(self, token_id: int, special: bool = True) -> bytes:
        """The bytes of one token (llama.cpp's `token_to_piece`; control-token text only
        when `special`)."""
        table = self._pieces.table(special)
        if not 0 <= token_id < len(table):
            raise IndexError(f"token id {token_id} is outside the vocabulary (size {len(table)})")
        return table[token_id]

    def decode_bytes(self, ids: Sequence[int], skip_special: bool = False) -> bytes:
        """llama.cpp's `llama_detokenize(ids, remove_special=skip_special,
        unparse_special=not skip_special)`, as raw bytes."""
        return detokenize(
            self.vocab,
            self._pieces,
            ids,
            remove_special=skip_special,
            unparse_special=not skip_special,
        )

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of `ids`. With `skip_special`, control tokens render as nothing and the
        BOS/EOS that `encode(add_special=True)` adds are dropped. Invalid UTF-8 (e.g. a
        cut multi-byte character) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special=skip_special)

    # --- chat -------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        template: str | None = None,
        **kw: Any,
    ) -> str:
        """Render a conversation with the model's template (or `template`).

        `bos_token`/`eos_token` are the model's; as llama.cpp does, a BOS (EOS) text at the
        start (end) of the result is removed when `encode(add_special=True)` adds it anyway.
        Encode the result with `parse_special=True`."""
        bos = (
            self.token_to_piece(self.bos_id).decode("utf-8", "replace")
            if self.bos_id is not None
            else ""
        )
        eos = (
            self.token_to_piece(self.eos_id).decode("utf-8", "replace")
            if self.eos_id is not None
            else ""
        )
        text = render_chat(
            template if template is not None else self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
            **kw,
        )
        if self.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        if self.add_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        return text

    def __repr__(self) -> str:
        return (
            f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
            f"bos={self.bos_id}, eos={self.eos_id}, eog={sorted(self.eot_ids)})"
        )
