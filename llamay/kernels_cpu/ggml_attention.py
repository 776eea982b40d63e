"""llama.cpp's CPU attention (numerics="llamacpp") as a native kernel, bit-identical to
its XLA emulation.

Reference and test oracle: `llamay.kernels.ggml_attention.attention` (after
`gather_pages` for a paged pool), which emulates ggml's f16 K·q, softmax and P·V in
f32 jnp, every rounding where ggml makes it. XLA runs that emulation as hundreds of
small fusions per layer (~20 ms of SmolLM2's 25 ms decode step); the kernel
(`src/ggml_attention.cc`) performs the same f32 operations in the same order, reading a
dense cache or the page pool in place through the page table, skipping the keys a query
cannot see (which add exact zeros in the emulation). It takes a kv head's query rows
together (a decode step's G heads, a block of a prefill chunk's tokens) and vectorises
each sum's lanes across keys, keeping every sum's order; a decode step with few rows is
split over the threads by key ranges and output lines.

`ggml_flash_attention_native`: llama.cpp's flash attention (-fa on) over an f16 cache
(`src/ggml_flash_attention.cc`), bit for bit `ggml_attention.flash_attention`: its path
(tiled, one pass per row, split) chosen from the step's real token count, which the
caller hands in (`rows`, as `ggml_rows.step_rows` counts it), and llama.cpp's `threads`.
Handled as below, but f16 K and V only (llama.cpp's tiled and split paths take F16 and
F32; a bf16 cache is the emulation's).

Handled: f16 or bf16 K and V (each its own), a dense cache [B, S, K, D] (or the stacks
[L, B, S, K, D] and `layer`), pages [P, ps, K, D] (or the pool [L, P, ps, K, D] and
`layer`) through page_table [B, M], causal or not, sliding windows, `q_prescaled`, any
number of query tokens, S (M·ps for pages) a multiple of 16 (the emulation's softmax
chunks). Not handled (None: the emulation runs): softcaps (the emulation takes XLA's
tanh, which no C library reproduces), f32 caches (an encoder's K/V: products that are
not exact, so XLA's contraction choices enter), quantised caches (llama.cpp's flash
attention, `ggml_attention.flash_attention`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels_cpu.build import targets

CACHE_DTYPES = (jnp.float16, jnp.bfloat16)


def f32_scale(scale: float, head_dim: int) -> np.float32:
    """The scale as llama.cpp computes it in f32 (as `ggml_attention._f32_scale`, which
    this room may not import): 1.0f / sqrtf(head_dim) by default."""
    default = np.float32(1.0) / np.sqrt(np.float32(head_dim))
    return default if abs(scale - head_dim**-0.5) < 1e-12 else np.float32(scale)


def applies(q, k, v, q_pos, page_table=None, layer=None, *, softcap=None, window=None,
            numerics="llamacpp", dtypes=CACHE_DTYPES) -> bool:  # fmt: skip
    """Whether the kernel computes this call (trace time; the build aside)."""
    if numerics != "llamacpp" or softcap:
        return False
    if not all(isinstance(a, jax.Array) for a in (k, v)):
        return False
    if k.dtype not in dtypes or v.dtype not in dtypes or k.shape != v.shape:
        return False
    q, q_pos = jnp.asarray(q), jnp.asarray(q_pos)
    if q.ndim != 4 or k.ndim != (4 if layer is None else 5):
        return False
    if window is not None and jnp.ndim(window) != 0:
        return False
    B, T, H, D = q.shape
    K = k.shape[-2]
    if k.shape[-1] != D or K == 0 or H % K or q_pos.shape != (B, T):
        return False
    if page_table is None:
        return k.shape[-4] == B and k.shape[-3] % 16 == 0
    page_table = jnp.asarray(page_table)
    return (
        page_table.ndim == 2
        and page_table.shape[0] == B
        and (page_table.shape[1] * k.shape[-3]) % 16 == 0
        and k.shape[-4] > 0
    )


def ggml_attention_native(
    q, k, v, q_pos, page_table=None, layer=None, *, scale: float, window=None,
    softcap: float | None = None, causal: bool = True, numerics: str = "llamacpp",
    q_prescaled: bool = False, variant: str = "native",
) -> jax.Array | None:  # fmt: skip
    """`ggml_attention.attention` of q [B, T, H, D] at q_pos [B, T] over a dense cache k, v
    [B, S, K, D] (page_table None) or pages [P, ps, K, D] read through page_table [B, M]
    (each also as the layer stack with `layer`) -> [B, T, H, D] f32, bit for bit; None
    when the kernel does not apply (module doc) or is not built."""
    if not applies(q, k, v, q_pos, page_table, layer, softcap=softcap, window=window,
                   numerics=numerics):  # fmt: skip
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    args = _operands(q, k, v, q_pos, page_table, layer, window)
    call = jax.ffi.ffi_call(prefix + "LlamayGgmlAttention", args[-1], vmap_method="sequential")
    return call(*args[:-1], **_attributes(q, page_table, scale, q_prescaled, causal))


def ggml_flash_attention_native(
    q, k, v, q_pos, page_table=None, layer=None, *, scale: float, window=None,
    softcap: float | None = None, causal: bool = True, numerics: str = "llamacpp",
    q_prescaled: bool = False, rows=None, threads: int = 1, variant: str = "native",
) -> jax.Array | None:  # fmt: skip
    """`ggml_attention.flash_attention` of q [B, T, H, D] over an f16 cache (dense or pages,
    as `ggml_attention_native`) -> [B, T, H, D] f32, bit for bit; `rows` the step's real
    token count (None: B·T), `threads` llama.cpp's. None when the kernel does not apply
    (module doc) or is not built."""
    if not applies(q, k, v, q_pos, page_table, layer, softcap=softcap, window=window,
                   numerics=numerics, dtypes=(jnp.float16,)):  # fmt: skip
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    B, T = jnp.shape(q)[:2]
    n = jnp.asarray(B * T if rows is None else rows, jnp.int32).reshape(())
    *ops, out = _operands(q, k, v, q_pos, page_table, layer, window)
    call = jax.ffi.ffi_call(prefix + "LlamayGgmlFlashAttention", out, vmap_method="sequential")
    return call(*ops, n, **_attributes(q, page_table, scale, q_prescaled, causal),
                threads=np.int32(max(int(threads), 1)))  # fmt: skip


def _operands(q, k, v, q_pos, page_table, layer, window):
    """Both handlers' operands (q, K, V, layer, table, q_pos, window) and the result's shape."""
    q, q_pos = jnp.asarray(q), jnp.asarray(q_pos)
    B = q.shape[0]
    paged = page_table is not None
    table = jnp.zeros((B, 1), jnp.int32) if not paged else jnp.asarray(page_table, jnp.int32)
    layer = jnp.zeros((), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32)
    w = jnp.asarray(0 if window is None else window, jnp.int32).reshape(())
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return q.astype(jnp.float32), k, v, layer, table, q_pos.astype(jnp.int32), w, out


def _attributes(q, page_table, scale, q_prescaled, causal) -> dict:
    return dict(
        kq_scale=f32_scale(scale, jnp.shape(q)[-1]), prescaled=np.int32(bool(q_prescaled)),
        causal=np.int32(bool(causal)), paged=np.int32(page_table is not None),
    )  # fmt: skip
