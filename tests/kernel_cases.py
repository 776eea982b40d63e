"""Random inputs the kernel tests share (tests/kernels_cpu, tests/kernels_pallas): matmul
activations and paged KV pools of llamay.kv.types, the pools written as the cache
writers store them (`kv_cache.encode`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kv.types import KV_TYPES
from llamay.quant import kv_cache

PAD = 1 << 30  # llamay.engine.paged_steps.PAD_POSITION


def acts(m: int, k: int, seed: int) -> jax.Array:
    """Activations x [m, k], f32 standard normal."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal((m, k)), jnp.float32)


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
