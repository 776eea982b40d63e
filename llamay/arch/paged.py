"""KV caches the decoder block can write and attend through: a dense per-sequence
array (slot j holds position j), or one layer of the paged pool seen through page
tables. `write_kv` and `attention` dispatch on the cache type at trace time, so one
block serves both and the dense path is exactly `llamay.arch.layers`.

`paged_attention(q, k_pages, v_pages, page_table, q_pos, ...)` is the signature the
Pallas paged-attention kernel plugs into; its jnp reference here gathers each row's
pages into a dense view (view slot j = position j) and runs the dense attention, so
both caches share one set of numerics (including the f16-cache rounding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay.arch import layers


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PagedLayer:
    """One layer's pages [P, page_size, K, D] and the batch's page tables [B, M]
    (entry m of row b: the page holding positions m·ps .. m·ps+ps-1; 0 = null page)."""

    pages: jax.Array
    table: jax.Array

    @property
    def shape(self) -> tuple[int, ...]:
        """The dense view's shape [B, M·ps, K, D] (what a dense cache's shape would be)."""
        P, ps, K, D = self.pages.shape
        return (self.table.shape[0], self.table.shape[1] * ps, K, D)


def paged_write(pages: jax.Array, table: jax.Array, new: jax.Array, positions: jax.Array):
    """Scatter new [B, T, K, D] into pages at `positions` [B, T] through the page table.
    Positions past the table (padding) are dropped."""
    P, ps = pages.shape[0], pages.shape[1]
    M = table.shape[1]
    valid = (positions >= 0) & (positions < M * ps)
    slot = jnp.clip(positions // ps, 0, M - 1)
    page = jnp.where(valid, jnp.take_along_axis(table, slot, axis=1), P)  # P: dropped
    return pages.at[page, positions % ps].set(new.astype(pages.dtype), mode="drop")


def gather_pages(pages: jax.Array, table: jax.Array) -> jax.Array:
    """The dense view [B, M·ps, K, D] of each row's pages."""
    B, M = table.shape
    v = pages[table]  # [B, M, ps, K, D]
    return v.reshape(B, M * pages.shape[1], *pages.shape[2:])


def paged_attention(q, k_pages, v_pages, page_table, q_pos, **kw):
    """Attention of q [B, T, H, D] at positions q_pos [B, T] over paged K/V (jnp
    reference: gather, then `layers.attention`; keywords as there)."""
    k = gather_pages(k_pages, page_table)
    v = gather_pages(v_pages, page_table)
    return layers.attention(q, k, v, q_pos, **kw)


def write_kv(cache, new: jax.Array, positions: jax.Array):
    if isinstance(cache, PagedLayer):
        return dataclasses.replace(
            cache, pages=paged_write(cache.pages, cache.table, new, positions)
        )
    return layers.write_kv(cache, new, positions)


def attention(q, k_cache, v_cache, q_pos, **kw):
    if isinstance(k_cache, PagedLayer):
        return paged_attention(q, k_cache.pages, v_cache.pages, k_cache.table, q_pos, **kw)
    return layers.attention(q, k_cache, v_cache, q_pos, **kw)
