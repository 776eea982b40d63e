"""Native paged attention over the KV pool, read in place through the page tables.

Reference: `llamay.kernels_pallas.paged_attention.paged_attention_reference` (gather each
row's pages into a dense view, then `attention_reference`), which the XLA path runs: it
copies every layer's pages into that dense view each step. The kernel
(`src/paged_attention.cc`) walks the page table instead: per row, block of query tokens
(one token decoding; a prefill or verify chunk in blocks) and chunk of the visible keys
(aligned to pages, or to 16 keys where pages are longer; so one row's decode step spreads
over the threads), the scores of every kv head's rows (causal, sliding window, softcap as
the reference), the chunk's softmax state, the weighted values; the chunks merged as
flash-decoding does. Blocks of 4 tokens or more (prefill chunks; head dims a multiple of
16) go in tiles instead: per row, kv head and block of tokens, flash attention with the
query rows innermost (q transposed once, each key broadcast against it, the online
softmax as vector operations over the rows), the keys split into parts when there are
fewer tiles than threads (SmolLM2's heads, 256 tokens after 3,840: 13 ms against 60 for
the blocks above and 100 for the reference). Exact numerics, any query length; equal to
the reference up to the f32 summation order (1e-5 relative). Pools: f32, f16 or bf16, or
quantised (q8_0, q5_1, q5_0, q4_1, q4_0: uint8 rows of GGUF blocks, `llamay.kv.types`), K
and V of independent types; a quantised row is dequantised as it is read (the values of
`llamay.quant.kv_cache.decode` bit for bit), so the reference for those is the pages
gathered, dequantised, then `attention_reference`. Queries whose output is unused differ:
one that sees no key, or at a position outside the table (padding), gives 0 (the
reference: NaN, or attention over the padded table). A dense cache is read as one page per
row (`llamay.kernels.attention.dense_pages`).

Not handled here (None: the dispatcher's reference): numerics "llamacpp", non-causal
attention, pools of other dtypes or row widths, other shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.build import targets
from llamay.quant import kv_cache

POOL_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16)
#: The block KV types the kernel reads in place (uint8 rows of D/32 GGUF blocks).
BLOCK_TYPES = (GGMLType.Q8_0, GGMLType.Q5_1, GGMLType.Q5_0, GGMLType.Q4_1, GGMLType.Q4_0)


def pool_type(pages, head_dim: int) -> GGMLType | None:
    """The KV type of a pool the kernel reads (`llamay.quant.kv_cache.cache_type`): f32,
    f16 or bf16 rows of head_dim, or uint8 rows of a `BLOCK_TYPES` type; None otherwise."""
    if pages.dtype in POOL_DTYPES:
        return kv_cache.cache_type(pages, head_dim) if pages.shape[-1] == head_dim else None
    try:
        t = kv_cache.cache_type(pages, head_dim)
    except ValueError:
        return None
    return t if t in BLOCK_TYPES else None


def applies(q, k_pages, v_pages, page_table, q_pos, layer, *, causal=True, numerics="exact"):
    """Whether the kernel computes this call (trace time; the build aside)."""
    if numerics != "exact" or not causal:
        return False
    if not all(isinstance(a, jax.Array) for a in (k_pages, v_pages)):  # not a pytree
        return False
    q, page_table, q_pos = (jnp.asarray(a) for a in (q, page_table, q_pos))
    if k_pages.shape[:-1] != v_pages.shape[:-1] or k_pages.ndim != (4 if layer is None else 5):
        return False
    B, T, H, D = q.shape if q.ndim == 4 else (0, 0, 0, 0)
    if pool_type(k_pages, D) is None or pool_type(v_pages, D) is None:  # (F32 is 0)
        return False
    K = k_pages.shape[-2]
    return (
        q.ndim == 4
        and K > 0
        and H % K == 0
        and page_table.shape[:1] == (B,)
        and page_table.ndim == 2
        and q_pos.shape == (B, T)
    )


def paged_attention_native(
    q, k_pages, v_pages, page_table, q_pos, layer=None, *, scale: float, window=None,
    softcap: float | None = None, causal: bool = True, numerics: str = "exact",
    q_prescaled: bool = False, variant: str = "native",
) -> jax.Array | None:  # fmt: skip
    """Attention of q [B, T, H, D] at q_pos [B, T] through page_table [B, M] over the
    pages [P, ps, K, D] (or the pool [L, P, ps, K, D] and `layer`) -> [B, T, H, D] f32,
    or None when the kernel does not apply or is not built. Arguments as
    `llamay.kernels.paged_reference`'s (`q_prescaled` only matters to llamacpp numerics)."""
    del q_prescaled
    if not applies(q, k_pages, v_pages, page_table, q_pos, layer, causal=causal,
                   numerics=numerics):  # fmt: skip
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    q, page_table, q_pos = (jnp.asarray(a) for a in (q, page_table, q_pos))
    layer = jnp.zeros((), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32)
    w = jnp.asarray(0 if window is None else window, jnp.int32).reshape(())
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    call = jax.ffi.ffi_call(prefix + "LlamayPagedAttention", out, vmap_method="sequential")
    return call(
        q.astype(jnp.float32), k_pages, v_pages, layer, page_table.astype(jnp.int32),
        q_pos.astype(jnp.int32), w, scale=np.float32(scale), softcap=np.float32(softcap or 0.0),
    )  # fmt: skip
