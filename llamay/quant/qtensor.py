"""`QTensor`: a weight that stays in its GGUF block layout until used inside jit.

A QTensor is a pytree leaf-holder: `data` is the packed bytes (uint8, shaped
[..., rows, row_bytes]); the GGML type and logical shape are static aux data,
so jit specialises on them and `lax.scan` can slice stacked layers along axis 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import BLOCK_SIZES, GGMLType


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QTensor:
    data: jax.Array  # uint8 [..., rows, row_bytes]
    ggml_type: GGMLType = field(metadata=dict(static=True))
    cols: int = field(metadata=dict(static=True))  # logical row length

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.data.shape[:-1], self.cols)

    @staticmethod
    def from_raw(raw: np.ndarray, ggml_type: GGMLType) -> QTensor:
        """Wrap a uint8 [..., row_bytes] numpy view (e.g. from `GGUFFile.raw`)."""
        block, size = BLOCK_SIZES[ggml_type]
        cols = raw.shape[-1] // size * block
        return QTensor(jnp.asarray(raw), GGMLType(ggml_type), cols)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """Dequantise all of it: [..., rows, cols] in `dtype` (call inside jit)."""
        from llamay.quant.jnp_dequant import dequantize_jnp

        return dequantize_jnp(self.data, self.ggml_type).astype(dtype)

    def rows(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Dequantise only the rows `ids` (embedding lookup): [*ids.shape, cols]."""
        from llamay.quant.jnp_dequant import dequantize_jnp

        return dequantize_jnp(jnp.take(self.data, ids, axis=-2), self.ggml_type).astype(dtype)


    def layer(self, index: jax.Array) -> QTensor:
        """Slice one entry of a stacked [L, rows, row_bytes] tensor by a traced index."""
        return QTensor(jax.lax.dynamic_index_in_dim(self.data, index, keepdims=False),
                       self.ggml_type, self.cols)


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class MixedQTensor:
    """One layer's weight when a role's layers have different GGML types (e.g. Q4_K_M
    files mix Q4_K and Q6_K): the per-type stacks, and which stack/entry is this layer's.

    Built inside the layer scan: `stacks` are closed over, `which`/`index` are scanned.
    """

    stacks: tuple[QTensor, ...]
    which: jax.Array  # int32 scalar: position in `stacks`
    index: jax.Array  # int32 scalar: entry within that stack


def qmatmul(x: jax.Array, w: QTensor | MixedQTensor) -> jax.Array:
    """x @ W.T for x [..., cols] and W [rows, cols]: the one matmul every architecture calls.

    Exact numerics: f32 accumulation over the dequantised weight.
    """
    if isinstance(w, MixedQTensor):
        branches = [lambda x, s=s: qmatmul(x, s.layer(w.index)) for s in w.stacks]
        return jax.lax.switch(w.which, branches, x)
    wf = w.dequantize(jnp.float32)
    return jnp.einsum("...k,nk->...n", x.astype(jnp.float32), wf, precision="highest")
