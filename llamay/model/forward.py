"""The forward pass: an architecture's `embed`, then `block` under `lax.scan` over the
stacked layers; `head` is left to the step that needs it (all rows or the last).
Steps are pure: `(weights, kv, batch) -> (outputs, kv)` with the KV state donated.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import architecture_of
from llamay.arch.decoder import local_layers
from llamay.arch.paged import DenseLayer, PagedLayer, SplitPagedLayer
from llamay.quant import ggml_rows
from llamay.quant.matrix import scan_split


def _split_layers(layers: dict[str, Any]):
    """What the layer scan slices per role, and per role how one layer's weight is rebuilt
    from its slice (`Matrix.scan_parts`: mixed-type stacks are closed over, not sliced)."""
    split = {role: scan_split(v) for role, v in layers.items()}
    return {r: s[0] for r, s in split.items()}, {r: s[1] for r, s in split.items()}


def forward(
    cfg,
    weights,
    kv,
    tokens,
    positions,
    *,
    hidden: bool = False,
    page_table=None,
    local_table=None,
    local_base=None,
    embeds=None,
):
    """Run all blocks over tokens [B, T] at positions [B, T].

    `embeds`, a pair (values [B, T, E], mask [B, T] bool), puts input embeddings (an
    image's, from `llamay.vision`) where the mask is set, in place of those tokens' own
    (unscaled: llama.cpp applies a family's embedding scale to token batches only).

    `kv` is a `DenseKV`, or a `PagedKV` pool read and written through `page_table`
    [B, M] (each block sees it as a `llamay.arch.paged.PagedLayer` of its layer); a
    pool with a local part (sliding-window models) also takes `local_table` [B, W] and
    `local_base` [B] (the position its slot 0 holds), and each block sees a
    `SplitPagedLayer`.
    Returns (final hidden state [B, T, E], new kv, per-layer outputs [L, B, T, E] or None).
    Padding tokens (positions past the cache) are not counted among the rows of the
    blocks' matmuls (`ggml_rows`: llamacpp numerics choose ggml's kernel by that count).
    """
    valid = real_tokens(kv, positions, page_table)
    with ggml_rows.real_rows(ggml_rows.count_of(valid), of=valid.size):
        return _forward(cfg, weights, kv, tokens, positions, hidden, page_table, local_table,
                        local_base, embeds)  # fmt: skip


def real_tokens(kv, positions: jax.Array, page_table=None) -> jax.Array:
    """[B, T] bool: a step's real tokens (its padding has positions past the cache)."""
    capacity = kv.k.shape[2] * (1 if page_table is None else page_table.shape[1])
    return ggml_rows.valid_tokens(positions, capacity)


def head_rows(cfg, weights, x: jax.Array, valid: jax.Array) -> jax.Array:
    """The LM head over x [B, T, E] whose real rows are `valid` [B, T] (the count
    llamacpp numerics choose ggml's kernel by, `ggml_rows`)."""
    with ggml_rows.real_rows(ggml_rows.count_of(valid), of=valid.size):
        return architecture_of(cfg).head(cfg, weights, x)


def _forward(cfg, weights, kv, tokens, positions, hidden, page_table, local_table, local_base,
             embeds):  # fmt: skip
    arch = architecture_of(cfg)
    x = arch.embed(cfg, weights, tokens, positions)
    if embeds is not None:
        values, mask = embeds
        x = jnp.where(mask[..., None], values.astype(x.dtype), x)
    scanned, rebuild = _split_layers(weights["layers"])

    def layer_weights(lw_scanned):
        return {role: rebuild[role](val) for role, val in lw_scanned.items()}

    layer_ids = jnp.arange(kv.k.shape[0], dtype=jnp.int32)
    if page_table is not None and kv.local_k is not None:
        return _split_paged(cfg, arch, kv, x, positions, scanned, layer_weights, hidden,
                            page_table, (local_table, local_base))  # fmt: skip
    if page_table is not None:
        # The pool rides in the carry, updated in place; each layer reads only its
        # rows' pages (scanning it as xs/ys would copy the whole pool every step).
        def paged_body(carry, xs):
            x, kp, vp = carry
            lw_scanned, layer = xs
            k, v = PagedLayer(kp, page_table, layer), PagedLayer(vp, page_table, layer)
            x, k, v = arch.block(cfg, layer_weights(lw_scanned), x, positions, k, v, layer)
            return (x, k.pages, v.pages), x if hidden else None

        (x, k, v), hs = jax.lax.scan(paged_body, (x, kv.k, kv.v), (scanned, layer_ids))
        return x, dataclasses.replace(kv, k=k, v=v), hs

    # The dense cache rides in the carry too (scanned as xs/ys, every step copied the
    # whole cache out and back: SmolLM2 decode 1.6x slower at batch 1), written and read
    # in place through a `DenseLayer` view of the stack.
    def dense_body(carry, xs):
        x, kc, vc = carry
        lw_scanned, layer = xs
        k, v = DenseLayer(kc, layer), DenseLayer(vc, layer)
        x, k, v = arch.block(cfg, layer_weights(lw_scanned), x, positions, k, v, layer)
        return (x, k.stack, v.stack), x if hidden else None

    (x, k, v), hs = jax.lax.scan(dense_body, (x, kv.k, kv.v), (scanned, layer_ids))
    return x, dataclasses.replace(kv, k=k, v=v), hs


def _split_paged(cfg, arch, kv, x, positions, scanned, layer_weights, hidden, table, local_view):
    """The paged scan over a pool split into global and local (sliding-window) layers:
    both pools ride in the carry; each layer writes and reads only its own kind's."""
    local = local_layers(cfg)
    rank = np.where(local, np.cumsum(local) - 1, np.cumsum(~local) - 1).astype(np.int32)
    local_table, base = local_view

    def body(carry, xs):
        x, kg, vg, kl, vl = carry
        lw_scanned, layer, is_loc, r = xs
        k = SplitPagedLayer(PagedLayer(kg, table, r), PagedLayer(kl, local_table, r), is_loc, base)
        v = SplitPagedLayer(PagedLayer(vg, table, r), PagedLayer(vl, local_table, r), is_loc, base)
        x, k, v = arch.block(cfg, layer_weights(lw_scanned), x, positions, k, v, layer)
        return (x, k.glob.pages, v.glob.pages, k.loc.pages, v.loc.pages), x if hidden else None

    xs = (scanned, jnp.arange(cfg.n_layers, dtype=jnp.int32), jnp.asarray(local), jnp.asarray(rank))
    (x, kg, vg, kl, vl), hs = jax.lax.scan(body, (x, kv.k, kv.v, kv.local_k, kv.local_v), xs)
    return x, dataclasses.replace(kv, k=kg, v=vg, local_k=kl, local_v=vl), hs


@partial(jax.jit, static_argnames=("cfg", "hidden"), donate_argnames=("kv",))
def logits_step(cfg, weights, kv, tokens, positions, hidden: bool = False, embeds=None):
    """Logits at every position [B, T, V] (and per-layer hidden states if asked);
    `embeds` as `forward` takes them."""
    x, kv, hs = forward(cfg, weights, kv, tokens, positions, hidden=hidden, embeds=embeds)
    return head_rows(cfg, weights, x, real_tokens(kv, positions)), hs, kv
