"""KV caches the decoder block can write and attend through: a dense per-sequence
array (slot j holds position j), or one layer of the paged pool seen through page
tables. `write_kv` and `attention` dispatch on the cache type at trace time, so one
block serves both and the dense path is exactly `llamay.arch.layers`.

`paged_attention(q, k_pages, v_pages, page_table, q_pos, ...)` is the jnp reference of
the Pallas paged-attention kernel (`llamay.kernels_pallas`, which `attention` dispatches
to on GPU/TPU): it gathers each row's pages into a dense view (view slot j = position j)
and runs the dense attention, so both caches share one set of numerics (including the
f16-cache rounding).

A sliding-window model's pool is split into global and local layers' pools
(`llamay.kv.pages`); its blocks see a `SplitPagedLayer`, which writes into the
layer's own pool and attends through it alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay import kernels_pallas
from llamay.arch import layers


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
    return pages.at[idx].set(new.astype(pages.dtype), mode="drop")


def gather_pages(pages, table, layer=None):
    """The dense view [B, M·ps, K, D] of each row's pages (of pool layer `layer`)."""
    B, M = table.shape
    v = pages[(*_at(pages, layer), table)]  # [B, M, ps, K, D]: only these pages are read
    return v.reshape(B, M * pages.shape[-3], *pages.shape[-2:])


def paged_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw):
    """Attention of q [B, T, H, D] at positions q_pos [B, T] over paged K/V (one layer's
    pages, or the pool and `layer`). jnp reference: gather, then `layers.attention`
    (keywords as there)."""
    k = gather_pages(k_pages, page_table, layer)
    v = gather_pages(v_pages, page_table, layer)
    return layers.attention(q, k, v, q_pos, **kw)


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
    return layers.write_kv(cache, new, positions)


def attention(q, k_cache, v_cache, q_pos, **kw):
    if isinstance(k_cache, SplitPagedLayer):  # read only the layer's own pool
        return jax.lax.cond(
            k_cache.local,
            lambda: attention(q, k_cache.loc, v_cache.loc, q_pos - k_cache.base[:, None], **kw),
            lambda: attention(q, k_cache.glob, v_cache.glob, q_pos, **kw),
        )
    if isinstance(k_cache, PagedLayer):
        args = (q, k_cache.pages, v_cache.pages, k_cache.table, q_pos, k_cache.layer)
        if kernels_pallas.paged_kernel_applies(q, **kw):  # GPU/TPU: the Pallas kernel
            return kernels_pallas.paged_attention(*args, **kw)
        return paged_attention(*args, **kw)
    return layers.attention(q, k_cache, v_cache, q_pos, **kw)
