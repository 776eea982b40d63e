"""KV caches the decoder block can write and attend through: a dense per-sequence
array (slot j holds position j), or one layer of the paged pool seen through page
tables. `write_kv` writes through whichever view the block holds; `attention` hands the
view's arrays (pages and table, or the dense cache) to the one attention entry point,
`llamay.kernels.attention`, which chooses the implementation (reference, Pallas, native).

A sliding-window model's pool is split into global and local layers' pools
(`llamay.kv.pages`); its blocks see a `SplitPagedLayer`, which writes into the
layer's own pool and attends through it alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay import kernels
from llamay.arch import layers
from llamay.quant import kv_cache


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedLayer:
    """The page pool K or V — one layer's pages [P, page_size, K, D], or the whole
    pool [L, P, page_size, K, D] with `layer` (traced) naming the one a block uses —
    and the batch's page tables [B, M] (entry m of row b: the page holding positions
    m·ps .. m·ps+ps-1; 0 = the null page)."""

    pages: jax.Array
    table: jax.Array
    layer: jax.Array | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The dense view's shape [B, M·ps, K, D] (what a dense cache's shape would be)."""
        ps, K, D = self.pages.shape[-3:]
        return (self.table.shape[0], self.table.shape[1] * ps, K, D)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DenseLayer:
    """The dense caches of all layers [L, B, S, K, D] and the layer (traced, under the
    layer scan) a block uses. The block writes its rows into the stack and attends over
    the layer read back after the write, so the scan's carry is updated in place: a
    layer slice taken before the write and read after it made XLA copy the whole stack
    once per layer (Gemma 3 decode: two [18, 1, 256, 1, 256] copies per layer, 12 % of
    the step at 256 positions, growing with the context)."""

    stack: jax.Array
    layer: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The layer's shape [B, S, K, D]."""
        return self.stack.shape[1:]


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class SplitPagedLayer:
    """One layer of a pool split in two (sliding-window models): the global layers'
    pool and page tables, the local layers' pool and page tables, and whether this
    layer (traced, under the layer scan) is local. Each `PagedLayer.layer` is the
    layer's index among its kind. A row's local table covers only the pages near its
    window: its slot 0 holds position `base` [B] (page-aligned), so the local layers
    write and attend at positions less `base` (attention sees positions only through
    its causal and window masks, which a common shift leaves as they are)."""

    glob: PagedLayer
    loc: PagedLayer
    local: jax.Array
    base: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.glob.shape


def _at(pages: jax.Array, layer) -> tuple:
    return () if layer is None else (layer,)


def paged_write(pages, table, new, positions, layer=None):
    """Scatter new [B, T, K, D] into pages at `positions` [B, T] through the page table
    (into pool layer `layer` when given). Positions past the table (padding) are dropped."""
    P, ps = pages.shape[-4], pages.shape[-3]
    M = table.shape[1]
    valid = (positions >= 0) & (positions < M * ps)
    slot = jnp.clip(positions // ps, 0, M - 1)
    page = jnp.where(valid, jnp.take_along_axis(table, slot, axis=1), P)  # P: dropped
    idx = (*_at(pages, layer), page, positions % ps)
    return pages.at[idx].set(kv_cache.encode(new, pages), mode="drop")


def stored(cache) -> jax.Array:
    """The array a cache view stores its rows in (its dtype and row width say its KV
    type: `llamay.quant.kv_cache.cache_type`)."""
    if isinstance(cache, SplitPagedLayer):  # both pools have the one type
        return cache.glob.pages
    if isinstance(cache, PagedLayer):
        return cache.pages
    if isinstance(cache, DenseLayer):
        return cache.stack
    return cache


def write_kv(cache, new: jax.Array, positions: jax.Array):
    if isinstance(cache, SplitPagedLayer):  # the other kind's pool drops the write
        off = jnp.full_like(positions, -1)
        glob = write_kv(cache.glob, new, jnp.where(cache.local, off, positions))
        shifted = positions - cache.base[:, None]
        loc = write_kv(cache.loc, new, jnp.where(cache.local, shifted, off))
        return dataclasses.replace(cache, glob=glob, loc=loc)
    if isinstance(cache, PagedLayer):
        pages = paged_write(cache.pages, cache.table, new, positions, cache.layer)
        return dataclasses.replace(cache, pages=pages)
    if isinstance(cache, DenseLayer):  # positions past the cache (padding) are dropped
        rows = jnp.arange(new.shape[0])[:, None]
        stack = cache.stack.at[cache.layer, rows, positions].set(
            kv_cache.encode(new, cache.stack), mode="drop"
        )
        return dataclasses.replace(cache, stack=stack)
    return layers.write_kv(cache, new, positions)


def attention(q, k_cache, v_cache, q_pos, **kw):
    """`llamay.kernels.attention` through the block's cache views (keywords as there)."""
    if isinstance(k_cache, SplitPagedLayer):  # read only the layer's own pool
        return jax.lax.cond(
            k_cache.local,
            lambda: attention(q, k_cache.loc, v_cache.loc, q_pos - k_cache.base[:, None], **kw),
            lambda: attention(q, k_cache.glob, v_cache.glob, q_pos, **kw),
        )
    if isinstance(k_cache, PagedLayer):
        return kernels.attention(q, k_cache.pages, v_cache.pages, q_pos,
                                 page_table=k_cache.table, layer=k_cache.layer, **kw)  # fmt: skip
    if isinstance(k_cache, DenseLayer):
        return kernels.attention(q, k_cache.stack, v_cache.stack, q_pos, layer=k_cache.layer, **kw)
    return kernels.attention(q, k_cache, v_cache, q_pos, **kw)
