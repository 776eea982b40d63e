"""KV cache types: llama.cpp's `-ctk/-ctv` (`--cache-type-k/--cache-type-v`) for llamay's
caches, the dense one and the paged pool alike.

    name    stored as                              bytes per row of D   ggml type
    f32     float32 [..., D]                       4·D                  F32
    f16     float16 [..., D]                       2·D                  F16
    bf16    bfloat16 [..., D]                      2·D                  BF16
    q8_0    uint8 [..., D/32·34]: GGUF Q8_0 blocks 34·D/32 (1.0625·D)   Q8_0
    q5_1    uint8 [..., D/32·24]                   24·D/32 (0.75·D)     Q5_1
    q5_0    uint8 [..., D/32·22]                   22·D/32              Q5_0
    q4_1    uint8 [..., D/32·20]                   20·D/32              Q4_1
    q4_0    uint8 [..., D/32·18]                   18·D/32 (0.5625·D)   Q4_0

A row is one position's one kv head (D = head_dim, a multiple of 32 for the block
types). A quantised row is the GGUF bytes of its D/32 blocks, so a pool keeps its
shape [L, P, page_size, K, ·] and only the last axis and the dtype change; page copies,
growth, gathers and snapshots move bytes as they move floats. The block type of a uint8
cache is known from its row width and the head dim (the widths above differ), which is
how the writers and the attention paths (`llamay.quant.kv_cache`) decode it. K and V may
have different types. IQ4_NL (18 bytes a block, as Q4_0) is not offered.

This module knows only names and sizes (the kv room imports no quant); the block
formulas are `llamay.quant`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from llamay.errors import RequestError


@dataclass(frozen=True)
class KVType:
    name: str
    ggml_type: int  # GGML type id (llama-cpp-python's type_k / type_v)
    block_elems: int  # 1 for the float types
    block_bytes: int  # bytes per block (per element for the float types)
    dtype: object  # the stored array's dtype

    @property
    def quantised(self) -> bool:
        return self.block_elems > 1

    def row_width(self, head_dim: int) -> int:
        """The stored row's last-axis length for a head of `head_dim`."""
        if not self.quantised:
            return head_dim
        if head_dim % self.block_elems:
            raise RequestError(
                f"a {self.name} KV cache needs a head dim that is a multiple of "
                f"{self.block_elems}; this model's is {head_dim} (use f16, bf16 or f32)"
            )
        return head_dim // self.block_elems * self.block_bytes

    def row_bytes(self, head_dim: int) -> int:
        return self.row_width(head_dim) * np.dtype(self.dtype).itemsize


KV_TYPES: dict[str, KVType] = {
    t.name: t
    for t in (
        KVType("f32", 0, 1, 4, jnp.float32),
        KVType("f16", 1, 1, 2, jnp.float16),
        KVType("bf16", 30, 1, 2, jnp.bfloat16),
        KVType("q8_0", 8, 32, 34, jnp.uint8),
        KVType("q5_1", 7, 32, 24, jnp.uint8),
        KVType("q5_0", 6, 32, 22, jnp.uint8),
        KVType("q4_1", 3, 32, 20, jnp.uint8),
        KVType("q4_0", 2, 32, 18, jnp.uint8),
    )
}
_FLOAT_NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def kv_type(spec) -> KVType:
    """The KV type named `spec`: a name of `KV_TYPES` (any case), a KVType, or a float
    dtype (jnp.float16, "float32", ...), as older callers pass."""
    if isinstance(spec, KVType):
        return spec
    if isinstance(spec, str):
        name = _FLOAT_NAMES.get(spec.lower(), spec.lower())
    else:
        try:
            name = _FLOAT_NAMES.get(np.dtype(spec).name)
        except TypeError:
            name = None
    if name not in KV_TYPES:
        raise RequestError(f"unknown KV cache type {spec!r} (one of {', '.join(KV_TYPES)})")
    return KV_TYPES[name]


def kv_zeros(shape_lead: tuple[int, ...], head_dim: int, spec) -> jnp.ndarray:
    """A zeroed cache [*shape_lead, row width] of KV type `spec` (zero bytes: every block
    type decodes them to 0.0)."""
    t = kv_type(spec)
    return jnp.zeros((*shape_lead, t.row_width(head_dim)), t.dtype)


def kv_type_of(cache, head_dim: int) -> KVType:
    """The KV type of a stored cache array (its dtype and row width)."""
    dt = np.dtype(cache.dtype)
    if dt != np.uint8:
        return kv_type(dt)
    width = cache.shape[-1]
    for t in KV_TYPES.values():
        if t.quantised and head_dim % t.block_elems == 0 and t.row_width(head_dim) == width:
            return t
    raise ValueError(f"a uint8 KV cache of row width {width} is no block type for head dim "
                     f"{head_dim}")  # fmt: skip


def kv_pair(spec) -> tuple[KVType, KVType]:
    """(K type, V type) of a cache spec: one type for both (a name or dtype, as
    `kv_type` takes) or a pair (k, v)."""
    if isinstance(spec, tuple | list):
        k, v = spec
        return kv_type(k), kv_type(v)
    t = kv_type(spec)
    return t, t


def kv_label(spec) -> str:
    """How a snapshot records a cache spec: a float type by its numpy dtype name
    ("float16", as snapshots always have), a block type by its name ("q8_0"), and "K/V"
    ("q8_0/float16") when the two differ."""
    k, v = kv_pair(spec)

    def one(t: KVType) -> str:
        return t.name if t.quantised else np.dtype(t.dtype).name

    return one(k) if k == v else f"{one(k)}/{one(v)}"


def kv_bytes_per_token(spec, n_layers: int, n_kv_heads: int, head_dim: int) -> int:
    """Bytes a cache of this spec stores per position: K and V of every layer and head."""
    k, v = kv_pair(spec)
    return n_layers * n_kv_heads * (k.row_bytes(head_dim) + v.row_bytes(head_dim))
