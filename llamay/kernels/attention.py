"""The one attention entry point: grouped-query attention over a dense cache or through
page tables, the implementation chosen at trace time from the backend
(`backend.backend()`), the numerics and the query block.

    cache   numerics   backend                          implementation
    paged   exact      CPU auto, causal, any KV type    "native" (`kernels_cpu.paged_attention`:
                                                        the pages read in place through the
                                                        table, quantised rows dequantised
                                                        as read, any query tokens); when
                                                        it returns None (not built, another
                                                        pool type), the rows below
    paged   exact      Pallas (GPU/TPU, interpret),     "pallas" (`kernels_pallas.
                       causal, T <= 16 query tokens,    paged_attention_pallas`; quantised
                       any KV type                      tiles dequantised in the kernel)
    paged   exact      anything else                    "paged-reference" (`kernels_pallas.
                                                        paged_attention.paged_attention_reference`)
    any     llamacpp   CPU auto, f16/bf16 cache,        "native-ggml" (`kernels_cpu.
                       no softcap                       ggml_attention`; flash_attn: an f16
                                                        cache's `ggml_flash_attention`): bit
                                                        for bit the
                                                        rows below, a dense cache or the
                                                        pages read in place); on None
                                                        (not built, S % 16, f32 cache) the
                                                        rows below
    paged   llamacpp   any                              "paged-ggml" (the pages gathered, then
                                                        `ggml_attention.attention`)
    dense   exact      CPU auto, causal, any KV type    "native" (the paged kernel over the
                                                        cache viewed as pages: `dense_pages`,
                                                        no copy, any T); on None
                                                        the row below
    dense   exact      any                              "reference" (`kernels_pallas.
                                                        paged_attention.attention_reference`)
    dense   llamacpp   any                              "ggml" (`ggml_attention.attention`)

The references live beside the Pallas kernel they are the oracle of; the CPU path runs
exactly them. A quantised cache (q8_0, q4_0, ...: `llamay.kv.types`): a paged pool in
exact numerics takes the native kernel on CPU (each row dequantised as it is read; a
dense cache too) or the Pallas kernel (each page's tile dequantised in the kernel);
otherwise (neither kernel, llamacpp numerics) its pages are gathered, then read by the
dense reference (exact: dequantised; llamacpp: `ggml_attention`'s
emulation of llama.cpp's flash attention over that cache type).
Longer query blocks than `MAX_PAGED_QUERY_TOKENS` (prefill chunks) go to the reference on
GPU/TPU: the Pallas kernel holds T·(H/K) query rows per kv head on chip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay import kernels_cpu
from llamay.kernels import ggml_attention
from llamay.kernels.backend import Backend, backend
from llamay.kernels_pallas.paged_attention import (
    attention_reference,
    gather_pages,
    paged_attention_pallas,
    paged_attention_reference,
)
from llamay.quant import ggml_rows, kv_cache

MAX_PAGED_QUERY_TOKENS = 16


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    q_pos: jax.Array,
    *,
    page_table: jax.Array | None = None,
    layer: jax.Array | None = None,
    scale: float,
    window: jax.Array | int | None = None,
    softcap: float | None = None,
    causal: bool = True,
    numerics: str = "exact",
    q_prescaled: bool = False,
    flash_attn: bool = False,
    threads: int = 1,
) -> jax.Array:
    """Attention of q [B, T, H, D] at positions q_pos [B, T] -> [B, T, H, D] f32.

    Dense (page_table None): k, v are caches [B, S, K, D] whose slot j holds position j,
    or the stacks of all layers [L, B, S, K, D] and `layer` (traced) naming the one to read
    (the layer scan hands the whole stack: a copied-out slice would cost a copy per layer).
    Paged: k, v are one layer's pages [P, ps, K, D], or the pool [L, P, ps, K, D] and
    `layer`, read through page_table [B, M] (entry m of row b: the page holding positions
    m·ps .. m·ps+ps-1). Masks and scaling as `attention_reference`; numerics "llamacpp"
    (an f16 cache) as ggml computes it, `q_prescaled` saying whether llama.cpp's graph
    scales q before q·K (equal in exact math), `flash_attn` and `threads` choosing llama.cpp's
    flash attention and its split path's chunks (`ggml_attention.flash_attention`)."""
    kw = dict(scale=scale, window=window, softcap=softcap, causal=causal, numerics=numerics,
              q_prescaled=q_prescaled)  # fmt: skip
    fa = dict(flash_attn=flash_attn, threads=threads) if numerics == "llamacpp" else {}
    be = backend()
    quantised = kv_cache.is_quantised(k) or kv_cache.is_quantised(v)
    if numerics == "llamacpp" and be.native and not quantised:
        if flash_attn:  # the path follows the step's real token count, as the emulation's
            rows = ggml_rows.step_rows(q.shape[0] * q.shape[1])
            y = kernels_cpu.ggml_flash_attention(q, k, v, q_pos, page_table, layer, **kw,
                                                 rows=rows, threads=threads)  # fmt: skip
        else:
            y = kernels_cpu.ggml_attention(q, k, v, q_pos, page_table, layer, **kw)
        if y is not None:
            return y
    if be.native:  # any KV type, dense or paged (None: not built, or a call it does not take)
        if page_table is not None:
            y = kernels_cpu.paged_attention(q, k, v, page_table, q_pos, layer, **kw)
        else:
            y = kernels_cpu.paged_attention(q, *dense_pages(k, v), q_pos, layer, **kw)
        if y is not None:
            return y
    if page_table is None and layer is not None:  # one layer of the dense stacks
        k = jax.lax.dynamic_index_in_dim(k, layer, keepdims=False)
        v = jax.lax.dynamic_index_in_dim(v, layer, keepdims=False)
    choice = attention_choice(q, paged=page_table is not None, causal=causal,
                              numerics=numerics, be=be)  # fmt: skip
    if choice == "pallas":
        return paged_attention_pallas(
            q, k, v, page_table, q_pos, layer, scale=scale, window=window,
            softcap=softcap or None, platform=be.platform, interpret=be.interpret,
        )  # fmt: skip
    if page_table is not None:
        return paged_reference(q, k, v, page_table, q_pos, layer, **kw, **fa)
    return dense_reference(q, k, v, q_pos, **kw, **fa)


def dense_pages(k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A dense cache [(L,) B, S, K, D] as a page pool of one S-position page per row
    (the same array: a reshape into smaller pages made XLA copy the stacks to another
    layout per layer) and the page tables [B, 1] = row b's page b, so the paged kernel
    reads the cache in place (it splits a row's keys over the threads by itself)."""
    B = k.shape[-4]
    return k, v, jnp.arange(B, dtype=jnp.int32)[:, None]


def attention_choice(q: jax.Array, *, paged: bool, causal: bool = True, numerics: str = "exact",
                     be: Backend | None = None) -> str:  # fmt: skip
    """The name of the implementation (module docstring) `attention` runs when no native
    kernel takes the call (any KV type: the Pallas kernel reads quantised pages too)."""
    be = backend() if be is None else be
    if not paged:
        return "ggml" if numerics == "llamacpp" else "reference"
    if numerics == "llamacpp":
        return "paged-ggml"
    if be.pallas and causal and q.shape[1] <= MAX_PAGED_QUERY_TOKENS:
        return "pallas"
    return "paged-reference"


def dense_reference(
    q, k_cache, v_cache, q_pos, *, numerics: str = "exact", q_prescaled: bool = False,
    flash_attn: bool = False, threads: int = 1, **kw,
) -> jax.Array:  # fmt: skip
    """Attention over a dense cache in either numerics (the keywords of `attention`); a
    quantised cache is read as llama.cpp's flash attention reads it (llamacpp) or
    dequantised (exact)."""
    if numerics == "llamacpp":
        return ggml_attention.attention(q, k_cache, v_cache, q_pos, q_prescaled=q_prescaled,
                                        flash_attn=flash_attn, threads=threads, **kw)  # fmt: skip
    D = q.shape[-1]
    k_cache, v_cache = kv_cache.decode(k_cache, D), kv_cache.decode(v_cache, D)
    return attention_reference(q, k_cache, v_cache, q_pos, **kw)


def paged_reference(
    q, k_pages, v_pages, page_table, q_pos, layer=None, *, numerics="exact", q_prescaled=False, **kw
) -> jax.Array:
    """Attention through page tables in either numerics (the arguments `attention` hands
    `kernels_cpu.paged_attention` too): exact is the Pallas kernel's reference itself."""
    quantised = kv_cache.is_quantised(k_pages) or kv_cache.is_quantised(v_pages)
    if numerics == "exact" and not quantised:
        return paged_attention_reference(q, k_pages, v_pages, page_table, q_pos, layer, **kw)
    k = gather_pages(k_pages, page_table, layer)
    v = gather_pages(v_pages, page_table, layer)
    return dense_reference(q, k, v, q_pos, numerics=numerics, q_prescaled=q_prescaled, **kw)
