"""The Python API research scripts use: `llamay.load(...)` and `Model`.

m = llamay.load("smollm2:135m")          # or a path to a .gguf
m.generate("Once upon a time", max_tokens=32, temperature=0)
m.logits(m.tokenize("The capital of France is"))   # numpy [T, vocab] float32
m.close()                                 # or `with llamay.load(...) as m:`

`generate` runs through the model's continuous-batching engine (`m.engine`, a
`BatchEngine` made on first use), so generate calls from several threads share
its batch; `generation` is the unpaged single-sequence reference path (dense KV).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from llamay.arch import Architecture, get_architecture
from llamay.arch.validate import check_tensors
from llamay.engine import Generation, Runtime, check_prompt, padded_batch
from llamay.engine.api import Handle, Request
from llamay.engine.generate import prefill_chunk, token_ids
from llamay.errors import ConstraintIncompleteError, ImageError, RequestError
from llamay.gguf import GGUFFile
from llamay.kv import bucket, new_dense_kv
from llamay.kv.types import kv_pair, kv_type
from llamay.model import bind, logits_step
from llamay.model import embed as embedding
from llamay.runtime import enable_compilation_cache, physical_cores
from llamay.sample import Sampler
from llamay.tok import IncrementalDecoder, StopStrings, Tokenizer

NUMERICS = ("exact", "llamacpp")
# The KV cache of each numerics: llama.cpp's default cache is F16, and attention
# against an f16 cache rounds as ggml does (see `llamay.kernels.ggml_attention`).
KV_DTYPES = {"exact": jnp.float32, "llamacpp": jnp.float16}
# The engine behind `generate`: a few slots for concurrent callers; a pool that starts
# at ENGINE_START_TOKENS positions and grows to one whole context; prefill in chunks of
# 256 (a 2,000-token prompt: first token ~40 % sooner than one 2,048 chunk, SmolLM2 CPU).
ENGINE_SLOTS, ENGINE_PAGE, ENGINE_CHUNK, ENGINE_START_TOKENS = 4, 16, 256, 2048


def flash_attn_flag(value: bool | str) -> bool:
    """llama.cpp's -fa value as a bool: on / off / auto (on: llama.cpp's choice on CPU),
    also true / false / 1 / 0 and bools."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("on", "auto", "true", "1", "yes"):
        return True
    if v in ("off", "false", "0", "no"):
        return False
    raise RequestError(f"flash_attn must be on, off or auto, not {value!r}")


def cache_types(numerics: str, kv_dtype=None, cache_type_k=None, cache_type_v=None):
    """The KV cache spec of a model (`llamay.kv.types`): the numerics' default
    (`KV_DTYPES`) unless `kv_dtype` (one type, or a (K, V) pair) or llama.cpp's
    `cache_type_k` / `cache_type_v` names (f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0)
    say otherwise. Returns the default dtype itself, one name, or a (K, V) pair."""
    if kv_dtype is None and cache_type_k is None and cache_type_v is None:
        return KV_DTYPES[numerics]
    k, v = kv_pair(KV_DTYPES[numerics] if kv_dtype is None else kv_dtype)
    k = kv_type(cache_type_k) if cache_type_k is not None else k
    v = kv_type(cache_type_v) if cache_type_v is not None else v
    return k.name if k == v else (k.name, v.name)


class Model:
    """A loaded model: config, weights pytree, tokenizer, and the calls that use them."""

    projector = None  # a llamay.vision.Projector once attach_projector() (mmproj=) ran

    def __init__(
        self,
        path: str | os.PathLike,
        numerics: str = "exact",
        n_ctx: int | None = None,
        lora=(),
        kv_dtype=None,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        flash_attn: bool | str = False,
        ggml_threads: int | None = None,
    ):
        if numerics not in NUMERICS:
            raise RequestError(f"numerics must be one of {NUMERICS}, not {numerics!r}")
        kv_spec = cache_types(numerics, kv_dtype, cache_type_k, cache_type_v)
        enable_compilation_cache()
        self.path = Path(path)
        self.numerics = numerics
        self.gguf = GGUFFile(self.path)
        self.arch = get_architecture(self.gguf.architecture)
        self.config = dataclasses.replace(
            self.arch.config(self.gguf.metadata), numerics=numerics,
            flash_attn=flash_attn_flag(flash_attn),
            ggml_threads=physical_cores() if ggml_threads is None else int(ggml_threads),
        )  # fmt: skip
        if self.config.ggml_threads < 1:
            raise RequestError(f"ggml_threads must be at least 1, not {ggml_threads}")
        check_tensors(self.config, self.arch, self.gguf.tensors, str(self.path))
        self.tokenizer = Tokenizer.from_metadata(self.gguf.metadata)
        self.base_weights = bind(self.gguf, self.arch, self.config.n_layers, numerics)
        self.adapters, self.weights = self._attach(lora)
        ctx = self.config.context_length
        if n_ctx is not None and (
            isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 0
        ):
            raise RequestError(
                f"n_ctx must be a whole number of tokens (0: the model's {ctx}), not {n_ctx!r}"
            )
        if n_ctx is not None and 0 < n_ctx < 2:
            raise RequestError(
                f"n_ctx {n_ctx} leaves no room for a prompt and a reply (at least 2)"
            )
        self.n_ctx = min(n_ctx or ctx, ctx)
        for t in kv_pair(kv_spec):
            t.row_width(self.config.head_dim)  # a block type needs head_dim % 32 == 0
        self.runtime = Runtime(self.config, self.weights, self.n_ctx, kv_spec)
        # how embed() pools by default: the GGUF's <arch>.pooling_type (none when absent)
        self.pooling = embedding.pooling_of(self.gguf.metadata)
        self.parallel = ENGINE_SLOTS  # sequences the engine decodes together
        self._engine = None
        self._engine_lock = threading.Lock()

    def _attach(self, lora):
        """(adapters, weights): `lora` [(path, scale)] attached unmerged (`model.lora`)."""
        from llamay.model import lora as lora_mod

        lora = [(p, 1.0) if isinstance(p, str | os.PathLike) else p for p in lora]
        if not lora:
            return [], self.base_weights
        adapters = [lora_mod.read_adapter(p, self.gguf) for p, _ in lora]
        scales = [float(s) for _, s in lora]
        weights = lora_mod.attach(
            self.base_weights, self.arch, self.config.n_layers, adapters, scales
        )
        return adapters, weights

    def with_lora(self, lora) -> Model:
        """This model (same base weights and tokenizer) with the LoRA adapters `lora`
        [(path, scale), ...] (or paths, scale 1) applied unmerged, all at once as
        llama.cpp's --lora does; `[]` gives the base model back. Its own engine."""
        new = copy.copy(self)
        new.adapters, new.weights = self._attach(lora)
        new.runtime = dataclasses.replace(self.runtime, weights=new.weights)
        new._engine, new._engine_lock = None, threading.Lock()
        return new

    def logits_batch(self, prompts, lora_rows=None) -> list[np.ndarray]:
        """Logits of each prompt (lists of ids) run as one batch: [len(ids), vocab] each.
        `lora_rows`: per prompt, its scale for each loaded adapter (zeros: the base model),
        so one program mixes adapters; None: every prompt applies all at their scales."""
        from llamay.model.lora import with_rows

        if isinstance(prompts, str) or not prompts:
            raise TypeError("logits_batch takes a non-empty list of prompts (lists of token ids)")
        prompts = [self._ids(ids) for ids in prompts]
        cfg, weights = self.config, self.weights
        if lora_rows is not None:
            rows = np.asarray(lora_rows, np.float32)
            if rows.shape != (len(prompts), len(self.adapters)) or not self.adapters:
                raise RequestError(
                    f"lora_rows must be [{len(prompts)} prompts, {len(self.adapters)} "
                    f"adapters loaded], not {list(rows.shape)}"
                )
            weights = with_rows(weights, rows)
        n, slots = len(prompts), bucket(max(len(ids) for ids in prompts))
        kv = new_dense_kv(
            cfg.n_layers, n, slots, cfg.n_kv_heads, cfg.head_dim, self.runtime.kv_dtype
        )
        tokens = np.zeros((n, slots), np.int32)
        positions = np.full((n, slots), slots, np.int32)  # padding is dropped
        for b, ids in enumerate(prompts):
            tokens[b, : len(ids)] = ids
            positions[b, : len(ids)] = np.arange(len(ids))
        logits, _, _ = logits_step(cfg, weights, kv, jnp.asarray(tokens), jnp.asarray(positions))
        return [np.asarray(logits[b, : len(ids)], np.float32) for b, ids in enumerate(prompts)]

    # -- the engine -------------------------------------------------------------------

    @property
    def engine(self):
        """The model's `BatchEngine` (made on first use; `close()` stops it)."""
        with self._engine_lock:
            if self._engine is None:
                from llamay.engine.scheduler import BatchEngine, default_decode_steps

                def pages(n_tokens: int) -> int:
                    return -(-n_tokens // ENGINE_PAGE) + 1  # + the null page

                whole = self.n_ctx + 1  # a request may reserve one position past the end
                self._engine = BatchEngine(
                    self,
                    slots=self.parallel,
                    page_size=ENGINE_PAGE,
                    chunk=prefill_chunk(self, ENGINE_CHUNK),
                    n_pages=pages(min(whole, ENGINE_START_TOKENS)),
                    max_pages=pages(whole),
                    speculative=getattr(self, "speculative", None),
                    decode_steps=default_decode_steps(),
                )
            return self._engine

    def use_parallel(self, n: int) -> Model:
        """Decode up to `n` sequences together in the engine (llama.cpp's --parallel;
        default 4): concurrent `generate` calls share its steps. Returns self."""
        if n < 1:
            raise RequestError(f"parallel must be at least 1, not {n}")
        if n != self.parallel:
            self.close()  # the next engine has n slots
            self.parallel = n
        return self

    def use_draft(self, draft, draft_max=None, draft_min=None, p_min=None) -> Model:
        """Speculative decoding for this model's engine (`llamay.engine.speculative`):
        `draft` "ngram" (prompt lookup), a loaded Model or a path/name to load (same
        tokenizer), a `Speculation`, or None (off); the rest llama.cpp's --draft-max,
        --draft-min, --draft-p-min (its defaults when None). Returns self."""
        from llamay.engine.speculative import DRAFT_MAX, DRAFT_MIN, DRAFT_P_MIN, Speculation

        if draft is not None and not isinstance(draft, Speculation):
            if not isinstance(draft, Model) and draft != "ngram":
                c = self.config
                draft = load(draft, numerics=self.numerics, n_ctx=self.n_ctx, progress=False,
                             flash_attn=c.flash_attn, ggml_threads=c.ggml_threads)  # fmt: skip
            draft = Speculation(
                draft,
                DRAFT_MAX if draft_max is None else draft_max,
                DRAFT_MIN if draft_min is None else draft_min,
                DRAFT_P_MIN if p_min is None else p_min,
            )
        self.close()  # the next engine drafts (or not)
        self.speculative = draft
        return self

    def warmup(self, rows=(1,), length: int = 512, prefill=None):
        """Compile the engine's step programs ahead of time into the persistent cache, so a
        later process's `generate` starts without compiling (`llamay.engine.warmup`)."""
        from llamay.engine.warmup import warmup

        return warmup(self.engine, rows, length, prefill)

    def attach_projector(self, mmproj) -> Model:
        """Give this model images: `mmproj` a multimodal projector GGUF (llama-server's
        --mmproj; `llamay.vision`), its tower in this model's numerics. Returns self."""
        from llamay.errors import ProjectorError
        from llamay.vision import Projector

        proj = mmproj if isinstance(mmproj, Projector) else Projector.load(mmproj, self.numerics)
        if proj.cfg.n_text != self.config.d_model:
            raise ProjectorError(
                f"{proj.path}: the projector's output width {proj.cfg.n_text} is not this "
                f"model's embedding width {self.config.d_model} (an mmproj for another model?)"
            )
        self.projector = proj
        self.close()  # the next engine sizes its steps for the projector's images
        return self

    def close(self) -> None:
        """Stop the engine (cancelling what it runs); the model stays usable."""
        with self._engine_lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- text <-> ids ----------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False):
        """Token ids of `text` as llama.cpp makes them: BOS/EOS per the model when
        `add_special`; special-token text (e.g. `<|im_start|>`) parsed when `parse_special`."""
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, ids) -> str:
        """The text of `ids`, as llama.cpp detokenises it (special tokens rendered)."""
        return self.tokenizer.decode(list(ids))

    # -- numbers ----------------------------------------------------------------------

    def logits(self, ids) -> np.ndarray:
        """Logits at every position of `ids`: numpy [len(ids), vocab] float32."""
        return self._run(ids, hidden=False)[0]

    def hidden_states(self, ids) -> np.ndarray:
        """Each block's output at every position: numpy [n_layers, len(ids), d_model]."""
        return self._run(ids, hidden=True)[1]

    def embed(self, ids, pooling: str | None = None, normalize: int = -1) -> np.ndarray:
        """The embedding of `ids` as llama.cpp computes it, unnormalised: the last layer's
        states after the final norm (before a decoder's LM head), pooled as `pooling` says
        or else `self.pooling` (the GGUF's `<arch>.pooling_type`, or `llamay serve
        --pooling`): "mean", "cls" (first token), "last" -> [d_model]; "none" -> the
        per-token states [len(ids), d_model]; "rank" -> a cross-encoder's scores
        [n_cls_out] (`rerank_tokens` makes the query/document pair input). `normalize` is
        llama.cpp's embd_normalize: -1 none, 0 max-abs int16, 1 taxicab, 2 Euclidean, p>2
        p-norm (per token for "none")."""
        kind = embedding.check_pooling(pooling or self.pooling)
        if kind == "rank" and not self.has_rank_head:
            raise RequestError(
                f"{self.path.name} has no rank head (cls.output.weight): rank pooling "
                "needs a cross-encoder reranker"
            )
        ids = self._ids(ids)
        cfg, slots = self.config, bucket(len(ids))
        # llama.cpp runs encoders without a KV cache: their K and V stay f32 (not f16), but
        # its flash attention takes them cast to f16
        f16 = cfg.flash_attn and cfg.numerics == "llamacpp"
        kv_dtype = self.runtime.kv_dtype if cfg.causal else (jnp.float16 if f16 else jnp.float32)
        kv = new_dense_kv(cfg.n_layers, 1, slots, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
        tokens, positions = padded_batch(ids, slots)
        states = embedding.states_step(cfg, self.weights, kv, tokens, positions)
        out = embedding.pool(np.asarray(states[0, : len(ids)], np.float32), kind, self.weights)
        if kind == "none":
            return np.stack([embedding.normalize(v, normalize) for v in out])
        return embedding.normalize(out, normalize)

    @property
    def has_rank_head(self) -> bool:
        """Whether the model is a cross-encoder reranker (llama.cpp's cls / cls.output)."""
        return any(r in self.weights for r in ("cls", "cls_out"))

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        """The query/document pair as one input, as llama-server's format_rerank makes it
        (BERT vocabularies: [CLS] query [SEP] document [SEP])."""
        tok = self.tokenizer
        q, d = (tok.encode(t, add_special=False, parse_special=True) for t in (query, document))
        return embedding.rerank_tokens(tok, q, d)

    def score(self, contexts, continuations, batch: int = 8, max_length: int | None = None):
        """[(log p(continuation | context), whether greedy decoding gives it)] per pair,
        batched and jit-compiled (`llamay.eval.scoring.score`)."""
        from llamay.eval.scoring import score

        return score(self, contexts, continuations, batch=batch, max_length=max_length)

    def loglikelihood_rolling(self, texts, batch: int = 8, max_length: int | None = None):
        """The total log-likelihood of each text, in windows of up to `max_length` tokens
        (`llamay.eval.scoring.loglikelihood_rolling`)."""
        from llamay.eval.scoring import loglikelihood_rolling

        return loglikelihood_rolling(self, texts, batch=batch, max_length=max_length)

    def with_architecture(self, arch: Architecture) -> Model:
        """This model (same weights and tokenizer) run by another Architecture, e.g.
        `dataclasses.replace(m.arch, block=...)`: research variants of a family."""
        new = copy.copy(self)
        new.arch = arch
        new.config = dataclasses.replace(self.config, impl=arch)
        new.runtime = dataclasses.replace(self.runtime, cfg=new.config)
        new._engine, new._engine_lock = None, threading.Lock()  # its own engine
        return new

    def _ids(self, ids) -> list[int]:
        """Token ids checked for a forward pass over them: integers in the vocabulary, at
        least one and at most the context."""
        ids = token_ids(ids, getattr(self.config, "vocab", None) or self.tokenizer.vocab_size)
        check_prompt(len(ids), self.n_ctx, reply=False)
        return ids

    def _run(self, ids, hidden: bool):
        ids = self._ids(ids)
        cfg = self.config
        slots = bucket(len(ids))
        kv_dtype = self.runtime.kv_dtype
        kv = new_dense_kv(cfg.n_layers, 1, slots, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
        tokens, positions = padded_batch(ids, slots)
        logits, hs, _ = logits_step(cfg, self.weights, kv, tokens, positions, hidden=hidden)
        n = len(ids)
        out = np.asarray(logits[0, :n], np.float32)
        return out, (np.asarray(hs[:, 0, :n], np.float32) if hidden else None)

    # -- generation ---------------------------------------------------------------------

    def generation(
        self,
        prompt_ids,
        max_tokens: int = 128,
        sampler: Sampler | None = None,
        constraint=None,
        decode_steps: int | None = None,
    ):
        """The token-level generator (an iterator of ids with a `finish_reason`) of at most
        `max_tokens` (negative: until the end or a full context); `constraint` (see
        `constraint()`) masks every step. `decode_steps`: tokens per dispatch (None:
        `llamay.engine.generate.default_decode_steps()`); the tokens are the same for any."""
        sampler = sampler or Sampler()
        return Generation(
            self.runtime,
            token_ids(prompt_ids, getattr(self.config, "vocab", None) or self.tokenizer.vocab_size),
            max_tokens,
            sampler,
            frozenset(self.tokenizer.stop_ids),
            constraint=constraint,
            pieces=self.token_pieces() if sampler.uses_dry else None,
            encode=self._encode_plain if sampler.uses_dry else None,
            decode_steps=decode_steps,
        )

    def _encode_plain(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=False, parse_special=False)

    def token_pieces(self) -> list[bytes]:
        """Every token's bytes (cached): DRY's sequence breakers and lexicon constraints."""
        if getattr(self, "_pieces", None) is None:
            tok = self.tokenizer
            self._pieces = [tok.token_to_piece(i) for i in range(tok.vocab_size)]
            self._pieces += [b""] * max(0, getattr(self.config, "vocab", 0) - len(self._pieces))
        return self._pieces

    def constraint(
        self,
        json_schema=None,
        grammar: str | None = None,
        regex: str | None = None,
        choices=None,
        json: bool = False,
        lenient: bool = False,
        after: str | None = None,
        format: str = "assert",
        closed_objects: bool = True,
    ):
        """A structured-output constraint for `generation()`, or None: a JSON schema (dict
        or text), a GBNF `grammar`, a `regex`, a list of `choices`, or `json` (a JSON
        object); `after` starts it once that text has been generated (e.g. "</think>").
        `format`: a schema's string formats are enforced ("assert") or ignored
        ("annotation"). `closed_objects`: a schema's objects without `additionalProperties`
        get no undeclared keys (default, as llama.cpp and OpenAI strict mode); False: full
        JSON-Schema semantics. Fails closed: what cannot be enforced raises ConstraintError
        naming it."""
        from llamay import constrain
        from llamay.constrain.guidance import FORMAT_MODES
        from llamay.errors import ConstraintError

        given = [
            k
            for k, v in (
                ("json_schema", json_schema),
                ("grammar", grammar),
                ("regex", regex),
                ("choices", choices),
                ("json", json or None),
            )
            if v is not None
        ]
        if format not in FORMAT_MODES:
            raise RequestError(f"format must be one of {FORMAT_MODES}, not {format!r}")
        if not given:
            return None
        if len(given) > 1:
            raise ConstraintError(f"give one constraint, not {' and '.join(given)}")
        n_vocab = max(getattr(self.config, "vocab", 0), self.tokenizer.vocab_size)
        if choices is not None:
            from llamay.constrain.choice import choices as make_choices
            from llamay.tok.vocab import ATTR_CONTROL

            special = np.flatnonzero(self.tokenizer.vocab.attrs & ATTR_CONTROL).tolist()
            c = make_choices(
                self.token_pieces()[:n_vocab],
                self.tokenizer.stop_ids,
                [str(x) for x in choices],
                special_ids=special,
            )
        else:
            lltok = constrain.lltokenizer_for(self.tokenizer, n_vocab)
            if json_schema is not None:
                c = constrain.json_schema(
                    lltok,
                    json_schema,
                    lenient=lenient,
                    format=format,
                    closed_objects=closed_objects,
                )
                if c.dropped:  # lenient: say what is not enforced (also in `c.dropped`)
                    warnings.warn(
                        "JSON schema (lenient): not enforced: " + "; ".join(c.dropped),
                        stacklevel=3,
                    )
            elif grammar is not None:
                c = constrain.gbnf(lltok, grammar, token_id=self.tokenizer.token_to_id)
            elif regex is not None:
                c = constrain.regex(lltok, regex)
            else:
                c = constrain.json_object(lltok)
        if after is not None:
            from llamay.constrain.trigger import Triggered

            c = Triggered(c, self.token_pieces(), trigger=after)
        return c

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        min_p: float = 0.05,
        seed: int | None = None,
        stream: bool = False,
        json_schema=None,
        grammar: str | None = None,
        regex: str | None = None,
        choices=None,
        json: bool = False,
        lenient: bool = False,
        after: str | None = None,
        format: str = "assert",
        closed_objects: bool = True,
        images=None,
        lora=None,
        stop: Sequence[str] | None = None,
        **sampling,
    ) -> str | Iterator[str]:
        """Continue `prompt`: text (special-token text parsed, BOS per the model, as
        llama.cpp's CLI does) or token ids as they are, by at most `max_tokens` tokens
        (negative: until the end or a full context, as llama.cpp's -1). Returns the text, or
        an iterator of text pieces when `stream` (closing it early cancels the request). Runs on
        `self.engine`: calls from several threads decode together (`use_parallel`).
        `stop`: strings that end the text before them (not included), as llama-server's
        and OpenAI's `stop`.

        Structured output: one of `json_schema`, `grammar` (GBNF), `regex`, `choices`,
        `json` (`format`, `closed_objects`: as in `constraint()`). Other llama.cpp sampler
        parameters (`repeat_penalty`, `dry_multiplier`, `mirostat`, `typical_p`,
        `samplers`...) pass through `sampling` to `Sampler`.

        `images` (a model loaded with `mmproj=`): one per `<__media__>` in the prompt, each
        encoded bytes, a path, a PIL image or an HxWx3 uint8 array (`llamay.multimodal`:
        their embeddings in place of tokens, in the same engine, prefix cache included).

        `lora` (a model loaded with adapters): this call's scale per adapter, {index: scale}
        (the others off; `{}`: the base model) or one per adapter; None: the load's scales.
        Calls with different adapters share the engine's batch, with no recompile."""
        if not self.config.causal:
            raise RequestError(
                f"{self.config.arch} is an embedding encoder, not a language model: it does "
                "not generate text (use embed())"
            )
        try:
            sampler = Sampler(temperature, top_k, top_p, min_p, seed, **sampling)
        except TypeError as e:
            raise RequestError(f"unknown sampling parameter: {e}") from None
        con = self.constraint(
            json_schema, grammar, regex, choices, json, lenient, after, format, closed_objects
        )
        spans = ()
        if images is not None:
            ids, spans = self._image_prompt(prompt, images)
        elif isinstance(prompt, str):
            ids = self.tokenize(prompt, add_special=True, parse_special=True)
        else:
            ids = [int(t) for t in prompt]
            if not ids:
                raise RequestError("the prompt is empty (no tokens to condition on)")
        engine = self.engine
        if max_tokens < 0:  # llama.cpp's n_predict -1: until the end or a full context
            max_tokens = self.n_ctx
        request = Request(ids, max_tokens, sampler, constraint=con, lora=lora, images=spans)
        handle = engine.submit(request)
        stops = StopStrings(stop)
        pieces = self._stream_text(engine, handle, stops)
        if stream:
            return TextStream(pieces, handle, stops)
        out = []
        try:
            for piece in pieces:
                out.append(piece)
        except ConstraintIncompleteError as e:
            e.partial = "".join(out)
            raise
        return "".join(out)

    def _image_prompt(self, prompt: str, images) -> tuple[list[int], tuple]:
        """(prompt ids, `ImageSpan`s) of a prompt with images (`llamay.multimodal.layout`)."""
        from llamay import multimodal

        if self.projector is None:
            raise ImageError(
                "this model has no vision projector: load it with mmproj=FILE "
                "(llama-server's --mmproj) to give it images"
            )
        p = multimodal.layout(self.tokenizer, self.projector, prompt, images)
        return p.ids, p.images

    def _stream_text(self, engine, handle: Handle, stops: StopStrings) -> Iterator[str]:
        dec = IncrementalDecoder(self.tokenizer)
        try:
            for ev in handle:
                out, hit = stops.feed(dec.feed(ev.token_id))
                if out:
                    yield out
                if hit:  # the text ends here; the request need not run on
                    return
        finally:
            if not handle.done:  # the caller stopped reading (or a stop string): free the slot
                engine.cancel(handle)
        out, hit = stops.feed(dec.flush(), final=True)
        if out:
            yield out
        con = handle.request.constraint
        if not hit and con is not None and not con.accepting:
            raise ConstraintIncompleteError(
                f"the output stopped ({handle.finish_reason}) after "
                f"{handle.usage.completion_tokens} tokens before the constraint was "
                "satisfied; allow more tokens (max_tokens; `llamay generate -n`): the text so "
                "far is in this error's `partial`"
            )

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Model({str(self.path)!r}, arch={c.arch!r}, layers={c.n_layers}, n_ctx={self.n_ctx})"
        )


class TextStream:
    """`Model.generate(stream=True)`: the text pieces as they come (closing it early cancels
    the request); once they end, `finish_reason` ("stop": an end token or a stop string;
    "length": max_tokens or a full context) and `completion_tokens`."""

    def __init__(self, pieces: Iterator[str], handle: Handle, stops: StopStrings):
        self._pieces, self._handle, self._stops = pieces, handle, stops

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()

    @property
    def finish_reason(self) -> str | None:
        return "stop" if self._stops.hit is not None else self._handle.finish_reason

    @property
    def completion_tokens(self) -> int:
        return self._handle.usage.completion_tokens


def load(
    path_or_name: str | os.PathLike,
    numerics: str = "exact",
    n_ctx: int | None = None,
    progress: bool = True,
    lora=(),
    mmproj=None,
    draft=None,
    kv_dtype=None,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    flash_attn: bool | str = False,
    ggml_threads: int | None = None,
) -> Model:
    """Load a model from a `.gguf` path or a store name (fetched on first use; a name
    llamay's store and catalogue lack may be a local Ollama store's). `lora`: llama.cpp
    GGUF LoRA adapters [(path, scale), ...] applied unmerged (`Model.with_lora`).
    `mmproj`: a multimodal projector GGUF for images (`Model.attach_projector`).
    `draft`: speculative decoding in its engine, "ngram" or a draft model with the same
    tokenizer (`Model.use_draft`).
    `kv_dtype`: the KV cache type (f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0: llama.cpp's
    `-ctk/-ctv` types; or a (K, V) pair), or `cache_type_k` / `cache_type_v` one each;
    by default f32 (exact) or f16 (llamacpp). See `llamay.kv.types`.
    `flash_attn`: llama.cpp's `-fa on` (True, or "on" / "off" / "auto" as its flag:
    auto is on, as on CPU); llamacpp numerics then round as its flash
    attention does (its tools' default, `-fa auto`, is on for CPU; llama-cpp-python's is off;
    a quantised cache always takes it), exact numerics are the same either way.
    `ggml_threads`: the thread count of the llama.cpp run reproduced (`-t`; by default this
    machine's cores, llama.cpp's default): its flash attention of one token over >= 512
    cells splits the cells by it, and rounds accordingly."""
    from llamay.ollama import find_blob
    from llamay.store import resolve
    from llamay.store.entries import adapter_paths, projector_path

    if not Path(path_or_name).is_file():  # a store model's ADAPTER layers, at scale 1
        lora = [*((p, 1.0) for p in adapter_paths(str(path_or_name))), *lora]
        if mmproj is None:  # and its projector layer (a vision model's mmproj GGUF)
            mmproj = projector_path(str(path_or_name))

    model = Model(
        resolve(str(path_or_name), progress=progress, elsewhere=find_blob)
        if not Path(path_or_name).is_file()
        else path_or_name,
        numerics=numerics,
        n_ctx=n_ctx,
        lora=lora,
        kv_dtype=kv_dtype,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        flash_attn=flash_attn,
        ggml_threads=ggml_threads,
    )
    # speculative decoding: "ngram", a draft model's path or name, a Model, a Speculation
    model = model if draft is None else model.use_draft(draft)
    return model.attach_projector(mmproj) if mmproj is not None else model
