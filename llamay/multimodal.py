"""Images in the token stream: a prompt with `<__media__>` markers, as llama.cpp's mtmd lays
it out, evaluated chunk by chunk over a dense KV cache.

`chunks(tokenizer, projector, prompt, images)` splits the prompt at mtmd's default marker
`<__media__>` (one per image, in order) and returns the list of chunks mtmd_tokenize makes:
("text", ids) and ("image", embeddings [n, n_text]). Each text piece is tokenized on its own
(special tokens parsed; BOS, where the model adds one, on the first piece only), and the
projector's markers are added around each image as mtmd adds them:

- gemma3: `<start_of_image>` before and `<end_of_image>` after, as text;
- mlp (LLaVA): nothing;
- idefics3 (SmolVLM): per tile `<fake_token_around_image><row_Y_col_X>` (text), the tile,
  a newline after each row but the last, then the ids of `\\n\\n`,
  `<fake_token_around_image>`, `<global-img>`, the overview, `<fake_token_around_image>`.

`prefill(...)` evaluates the chunks in order into one dense cache (`logits_step` with
input embeddings for image chunks), each chunk a batch of its own as
`mtmd_helper_eval_chunks` decodes them; gemma3's image chunks attend non-causally (every
image token sees the whole image: `mtmd_decode_use_non_causal`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict

import jax.numpy as jnp
import numpy as np

from llamay.errors import ImageError, RequestError
from llamay.kv import bucket, cache_slots, new_dense_kv
from llamay.model import logits_step
from llamay.vision import MEDIA_MARKER, ImageEmbedding, Projector

NON_CAUSAL = frozenset({"gemma3"})  # mtmd_decode_use_non_causal


def _lookup(tokenizer, text: str) -> int:
    """The token whose text is `text` (mtmd's lookup_token compares decoded pieces, so a
    byte-level vocabulary's `Ċ` is "\n")."""
    tid = tokenizer.token_to_id(text)
    if tid is None:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and tokenizer.decode(ids) == text:
            tid = ids[0]
    if tid is None:
        raise ImageError(
            f"the model's vocabulary lacks {text!r}, which the idefics3 projector's image "
            "layout needs (is this mmproj file for this model?)"
        )
    return tid


def chunks(tokenizer, projector: Projector, prompt: str, images) -> list[tuple[str, object]]:
    parts = prompt.split(MEDIA_MARKER)
    images = list(images)
    if len(parts) - 1 != len(images):
        raise ImageError(
            f"the prompt has {len(parts) - 1} {MEDIA_MARKER} markers for {len(images)} images "
            f"(each image goes where one {MEDIA_MARKER} is)"
        )
    out: list[tuple[str, object]] = []
    first = [True]

    def text(s: str) -> None:
        ids = tokenizer.encode(s, add_special=first[0], parse_special=True)
        first[0] = False
        if ids:
            out.append(("text", list(ids)))

    def ids(toks: list[int]) -> None:
        first[0] = False
        out.append(("text", list(toks)))

    kind = projector.kind
    for i, part in enumerate(parts):
        text(part)
        if i == len(images):
            break
        emb: ImageEmbedding = projector.embed(images[i])
        if kind == "gemma3":
            text("<start_of_image>")
            out.append(("image", emb.chunks[0]))
            text("<end_of_image>")
        elif kind == "idefics3":
            gx, gy = emb.grid
            for y in range(gy):
                for x in range(gx):
                    text(f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>")
                    out.append(("image", emb.chunks[y * gx + x]))
                if y != gy - 1:
                    ids([_lookup(tokenizer, "\n")])
            fake = _lookup(tokenizer, "<fake_token_around_image>")
            ids([_lookup(tokenizer, "\n\n"), fake, _lookup(tokenizer, "<global-img>")])
            out.append(("image", emb.chunks[-1]))
            ids([fake])
        else:
            out.extend(("image", c) for c in emb.chunks)
    return out


def n_positions(chs) -> int:
    return sum(len(c) for _, c in chs)


def prefill(cfg, weights, kv_dtype, chs, n_ctx: int, extra: int = 0):
    """Evaluate the chunks into a fresh dense cache with room for `extra` more positions.
    Returns (logits [V] at the last position, kv, n_positions)."""
    logits, kv, pos, _ = prefill_cached(cfg, weights, kv_dtype, chs, n_ctx, extra)
    return logits, kv, pos


class ImagePrefixCache:
    """The K/V of image prompts up to (and with) their last image, keyed by the content of
    that prefix (text ids, and each image's embeddings: the image's content), so a request
    that repeats an image prompt's beginning (a chat's next turn about the same image)
    skips encoding and prefilling it. Least recently used first out; thread-safe."""

    def __init__(self, entries: int = 4):
        self.entries = entries
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(chs) -> str:
        h = hashlib.sha256()
        for kind, data in chs:
            h.update(kind.encode())
            arr = np.ascontiguousarray(np.asarray(data, np.int64 if kind == "text" else np.float32))
            h.update(repr(arr.shape).encode() + arr.tobytes())
        return h.hexdigest()

    def get(self, key: str):
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
            return hit

    def put(self, key: str, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)


def _copy_kv(kv, slots: int):
    """A copy of a dense cache (the steps donate theirs), padded to `slots` positions."""

    def one(a):
        pad = slots - a.shape[2]
        a = jnp.array(a, copy=True)
        return jnp.pad(a, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 3)) if pad > 0 else a

    return dataclasses.replace(kv, k=one(kv.k), v=one(kv.v))


def prefill_cached(cfg, weights, kv_dtype, chs, n_ctx: int, extra: int = 0, cache=None):
    """`prefill`, reusing (and filling) an `ImagePrefixCache`: returns (logits, kv,
    n_positions, positions taken from the cache)."""
    n = n_positions(chs)
    if n == 0:
        raise RequestError("the prompt is empty")
    if n > n_ctx:
        raise RequestError(f"the prompt with its images takes {n} positions, past n_ctx {n_ctx}")
    slots = cache_slots(n + max(extra, 1), n_ctx)
    images = [i for i, (kind, _) in enumerate(chs) if kind == "image"]
    boundary = images[-1] + 1 if images and cache is not None else 0
    key = ImagePrefixCache.key(chs[:boundary]) if boundary else None
    hit = cache.get(key) if key is not None else None
    if hit is not None:
        kv0, pos, last = hit
        kv, first, cached = _copy_kv(kv0, max(slots, kv0.slots)), boundary, pos
        slots = kv.slots
    else:
        kv = new_dense_kv(cfg.n_layers, 1, slots, cfg.n_kv_heads, cfg.head_dim, kv_dtype)
        pos, last, first, cached = 0, None, 0, 0
    non_causal = dataclasses.replace(cfg, causal=False) if cfg.arch in NON_CAUSAL else cfg
    for i in range(first, len(chs)):
        kind, data = chs[i]
        m = len(data)
        T = bucket(m)
        tokens = np.zeros((1, T), np.int32)
        positions = np.full((1, T), slots, np.int32)  # padding: past the cache, dropped
        positions[0, :m] = pos + np.arange(m)
        if kind == "text":
            tokens[0, :m] = data
            logits, _, kv = logits_step(
                cfg, weights, kv, jnp.asarray(tokens), jnp.asarray(positions)
            )
        else:
            vals = np.zeros((1, T, data.shape[-1]), np.float32)
            vals[0, :m] = data
            mask = np.zeros((1, T), bool)
            mask[0, :m] = True
            emb = (jnp.asarray(vals), jnp.asarray(mask))
            logits, _, kv = logits_step(
                non_causal, weights, kv, jnp.asarray(tokens), jnp.asarray(positions), embeds=emb
            )
        last = logits[0, m - 1]
        pos += m
        if key is not None and i + 1 == boundary:
            cache.put(key, (_copy_kv(kv, kv.slots), pos, last))
    return last, kv, pos, cached


def generate_ids(model, prompt: str, images, max_tokens: int, sampler):
    """Token ids continuing an image prompt on `model` (its `projector` attached): the
    chunks prefilled as above, then one decode step per token with the model's sampler
    chain on device (`llamay.engine.steps.decode_step`). The penalties' history is the
    prompt's text tokens."""
    if model.projector is None:
        raise ImageError(
            "this model has no vision projector: load it with mmproj=FILE "
            "(llama-server's --mmproj) to give it images"
        )
    chs = chunks(model.tokenizer, model.projector, prompt, images)
    yield from generate_from_chunks(model, chs, max_tokens, sampler)


def prefix_cache(model) -> ImagePrefixCache:
    """The model's `ImagePrefixCache` (made on first use)."""
    cache = model.__dict__.get("_image_prefix_cache")
    if cache is None:
        cache = model.__dict__.setdefault("_image_prefix_cache", ImagePrefixCache())
    return cache


def generate_from_chunks(model, chs, max_tokens: int, sampler, stop_ids=None, usage=None):
    """`generate_ids` over chunks already laid out (`chunks`); `stop_ids`: the tokens that
    end it (default: the tokenizer's end-of-turn tokens). The image prompt's beginning
    comes from the model's `prefix_cache` when an earlier request had it; `usage` (an
    engine `Usage`) gets the positions so reused in `cached_tokens`."""
    from llamay.engine.steps import decode_step
    from llamay.sample import SamplerState, SamplingParams, sample

    rt, cfg = model.runtime, model.runtime.cfg
    n = n_positions(chs)
    budget = min(max_tokens, model.n_ctx - n)
    logits, kv, pos, cached = prefill_cached(
        cfg, rt.weights, rt.kv_dtype, chs, model.n_ctx, budget, prefix_cache(model)
    )
    if usage is not None:
        usage.cached_tokens = cached
    if budget <= 0:
        return
    text_ids = [t for kind, c in chs if kind == "text" for t in c]
    pieces = model.token_pieces() if sampler.uses_dry else None
    encode = model._encode_plain if sampler.uses_dry else None
    params = SamplingParams.stack([sampler], getattr(cfg, "vocab", None), pieces, encode)
    state = SamplerState.init([sampler], [text_ids], history=model.n_ctx)
    nxt, state = sample(logits[None], params, state)
    stop = frozenset(model.tokenizer.stop_ids) if stop_ids is None else frozenset(stop_ids)
    for i in range(budget):
        tok = int(nxt[0])
        if tok in stop:
            return
        yield tok
        if i + 1 == budget:
            return
        nxt, state, kv = decode_step(
            cfg, rt.weights, kv, nxt, jnp.asarray([pos], jnp.int32), params, state
        )
        pos += 1
