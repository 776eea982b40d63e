"""jax.numpy dequantisation of packed GGUF blocks, for use inside jit.

`dequantize_jnp` is pure shifts, masks, reshapes, broadcasts and bitcasts (no
gathers), written once in `formulas.py` and shared with the numpy version, so
XLA fuses it into one elementwise loop next to its consumer. The GGML type is a
Python value (static under jit); any number of leading dims is accepted
(e.g. stacked layers [L, rows, row_bytes]).

Numerics: equal bit for bit to `np_dequant.dequantize` for every type. Every
product in the formulas is exact in f32, so neither XLA's operation order nor
FMA contraction (GPU) can change a result. The one caveat: F16 NaN payloads
(which no real tensor contains) may be canonicalised by the device's
f16 -> f32 conversion; NaN stays NaN.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from llamay.gguf.constants import GGMLType
from llamay.quant.formulas import dequantize_blocks
from llamay.quant.layouts import blocks_of, jax_backend, layout_of


def dequantize_jnp(data: jax.Array, ggml_type: GGMLType | int) -> jax.Array:
    """uint8 [..., row_bytes] -> float32 [..., n_cols]; `ggml_type` must be static."""
    lay = layout_of(ggml_type)
    data = jnp.asarray(data)
    bk = jax_backend()
    blocks = blocks_of(bk, data, lay)
    out = dequantize_blocks(bk, lay, blocks)
    return out.reshape(*data.shape[:-1], blocks.shape[-2] * lay.block_elems)
