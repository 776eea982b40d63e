"""A dense per-sequence KV cache: slot j of a batch row holds position j.

The first state engine: one contiguous [L, B, S, K, D] buffer per K and V,
sized per request from a short bucket table so a new size rarely recompiles.
The paged pool, prefix tree, fork and snapshots build on this interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay.kv.types import kv_pair, kv_zeros

MIN_SLOTS = 256


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class DenseKV:
    k: jax.Array  # [L, B, S, K, D] (a quantised type: [L, B, S, K, row bytes] uint8)
    v: jax.Array  # [L, B, S, K, D]

    @property
    def slots(self) -> int:
        return self.k.shape[2]


def bucket(n: int, minimum: int = 16) -> int:
    """The smallest power of two >= max(n, minimum)."""
    n = max(n, minimum)
    return 1 << (n - 1).bit_length()


def cache_slots(needed: int, limit: int) -> int:
    """Slots for a sequence that needs `needed` positions, bucketed, at most `limit`."""
    return min(bucket(needed, MIN_SLOTS), limit)


def new_dense_kv(n_layers, batch, slots, n_kv_heads, head_dim, dtype=jnp.float32) -> DenseKV:
    """A zeroed cache; `dtype` is a KV cache type or a (K, V) pair of them
    (`llamay.kv.types`: f32, f16, bf16, q8_0, q4_0, ..., or a float dtype)."""
    kt, vt = kv_pair(dtype)
    lead = (n_layers, batch, slots, n_kv_heads)
    return DenseKV(kv_zeros(lead, head_dim, kt), kv_zeros(lead, head_dim, vt))
