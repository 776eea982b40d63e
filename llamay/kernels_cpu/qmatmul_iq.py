"""The native llamacpp-numerics matmul of the i-quants, TQ1_0/TQ2_0 and MXFP4
(`src/qmatmul_ggml_iq.cc`), beside its reference `llamay.quant.ggml_iq_dot` (the XLA
emulation of ggml's kernels, which this equals bit for bit).

The activations are quantised to the weight's vec_dot type (Q8_K; Q8_0 for IQ4_NL and
MXFP4) by the same jnp code the emulation runs, and the kernel is chosen as
`ggml_iq_dot.kernel_for` chooses it (from the weight's row count and x's real one:
`ggml_rows`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.quant import QTensor, ggml_float, ggml_rows, quantize_q8_0, quantize_q8_k
from llamay.quant.ggml_iq_dot import IQ_DOT_TYPES, KERNELS, Q8_0_TYPES, kernel_for

__all__ = ["IQ_DOT_TYPES", "qmatmul_iq_native"]


def qmatmul_iq_native(
    x: jax.Array, w: QTensor, prefix: str, layer: jax.Array, batched: bool | None = None
) -> jax.Array:
    """x [..., cols] @ W.T for an IQ/TQ/MXFP4 weight [rows, cols] (or a stack [L, rows,
    cols] read at `layer`) by the FFI target `prefix`LlamayQmmIQ; `batched` as
    `qtensor.ggml_matmul`'s."""
    lead, k = x.shape[:-1], x.shape[-1]
    n_rows, t = w.data.shape[-2], w.ggml_type
    x2 = ggml_float.opaque(x.astype(jnp.float32).reshape(-1, k))  # as ggml_matmul hides it
    if t in Q8_0_TYPES:
        acts = quantize_q8_0(x2, "x86")
        sums = jnp.zeros((x2.shape[0], k // 16), jnp.int16)  # unused by these types
    else:
        acts = quantize_q8_k(x2)
        sums = acts.sums
    out = jax.ShapeDtypeStruct((x2.shape[0], n_rows), jnp.float32)
    call = jax.ffi.ffi_call(prefix + "LlamayQmmIQ", out, vmap_method="sequential")
    args = (acts.qs, acts.d, sums, w.data, layer)

    def run(kernel: str):
        return lambda *args: call(*args, ggml_type=np.int32(t), kernel=np.int32(KERNELS[kernel]))

    if batched is not None:
        y = run(kernel_for(t, n_rows, 8 if batched else 1))(*args)
    else:  # the kernel of x's real row count (`ggml_rows`)
        y = ggml_rows.choose(x, lambda n: kernel_for(t, n_rows, n), run)(*args)
    return y.reshape(*lead, n_rows)
