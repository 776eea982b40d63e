"""Random inputs and checks the kernel tests share (tests/kernels_cpu, tests/kernels_pallas,
tests/quant): the native kernels' other builds, matmul activations, well-formed
i-quant/MXFP4 weight blocks, the exact matmul's reference and tolerance, and paged KV
pools of llamay.kv.types, the pools written as the cache writers store them
(`kv_cache.encode`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.build import VARIANTS
from llamay.kv.types import KV_TYPES
from llamay.quant import LAYOUTS, QTensor, kv_cache
from llamay.quant.quantize import random_blocks

PAD = 1 << 30  # llamay.engine.paged_steps.PAD_POSITION

#: The native kernels' builds besides this CPU's own (`llamay.kernels_cpu.build.VARIANTS`):
#: the portable one, and on x86 the AVX2 one, each held to the same results.
OTHER_BUILDS = [name for name in VARIANTS if name != "native"]


def acts(m: int, k: int, seed: int) -> jax.Array:
    """Activations x [m, k], f32 standard normal."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal((m, k)), jnp.float32)


def iq_blocks(t: GGMLType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Well-formed random blocks [rows, bytes] (`random_blocks`: every quant bit, f16
    scales uniform in ±0.01), plus MXFP4's exponent byte in 118..125 (finite, normal
    scales) and IQ1_M's d (the top nibbles of its four u16 scales) in 0.001..0.01."""
    raw = random_blocks(t, rows, cols, seed, scales=(-0.01, 0.01))
    raw = raw.reshape(rows, -1, LAYOUTS[t].block_bytes)
    rng = np.random.default_rng(seed)
    if t == GGMLType.MXFP4:
        raw[..., 0] = rng.integers(118, 126, raw.shape[:-1])
    elif t == GGMLType.IQ1_M:
        sc = raw[..., -8:].copy().view(np.uint16) & 0x0FFF
        d = rng.uniform(0.001, 0.01, raw.shape[:-1]).astype(np.float16).view(np.uint16)
        sc |= ((d[..., None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << 12
        raw[..., -8:] = sc.view(np.uint8)
    return raw.reshape(rows, -1)


def exact_reference(x: jax.Array, w: QTensor) -> jax.Array:
    """The exact matmul's oracle: the f32 dot over llamay.quant's dequantisation (itself
    checked against gguf-py in tests/quant)."""
    return jnp.einsum("mk,nk->mn", x, w.dequantize(jnp.float32), precision="highest")


def assert_close_sums(got, want, x, w: QTensor, what) -> None:
    """f32 sums in another order: within 1e-5 of the sum of |products| of each output."""
    scale = np.abs(np.asarray(x)) @ np.abs(np.asarray(w.dequantize())).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), what


def encode(x: jax.Array, name: str) -> jax.Array:
    """Float rows [..., D] as a cache of KV type `name` (how the writers store them)."""
    t = KV_TYPES[name]
    return kv_cache.encode(x, jnp.zeros((1, t.row_width(x.shape[-1])), t.dtype))


def make_case(B, T, H, K, D, ps, M, kt, vt, seed, layers=2, pad=0):
    """Pools [L, P, ps, K, row] of the two types with random contents (the null page
    too), distinct page tables, each row's T queries at the end of a length not a
    multiple of the page (the last `pad` of row 0 padding: position PAD)."""
    rng = np.random.default_rng(seed)
    P = B * M + 3
    k = encode(jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), jnp.float32), kt)
    v = encode(jnp.asarray(rng.standard_normal((layers, P, ps, K, D)), jnp.float32), vt)
    q = jnp.asarray(rng.standard_normal((B, T, H, D)) * 2, jnp.float32)
    perm = rng.permutation(np.arange(1, P))[: B * M].reshape(B, M)
    table = np.zeros((B, M), np.int32)
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        n = int(rng.integers(T, M * ps + 1))
        if n % ps == 0 and n > T:
            n -= 1
        table[b, : -(-n // ps)] = perm[b, : -(-n // ps)]
        pos[b] = np.arange(n - T, n)
    if pad:
        pos[0, T - pad :] = PAD
    return q, k, v, jnp.asarray(table), jnp.asarray(pos)
