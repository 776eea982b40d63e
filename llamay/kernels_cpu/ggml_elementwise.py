"""Two llama.cpp-numerics layers as native kernels (`src/ggml_elementwise.cc`),
bit-identical to their XLA emulation in `llamay.arch.ggml_ops` (the reference and test
oracle): `swiglu` (ggml_vec_swiglu_f32: g / (1 + ggml_v_expf(-g)) · u, the vector exp
from error-free sums as `llamay.quant.ggml_float.v_expf` builds it) and `rms_norm`
(ggml_compute_forward_rms_norm_f32: Σx² in double as `ggml_float.dsum`'s pairwise tree,
the mean as `div_pair`, x · 1/sqrt(mean + eps), times the weight) and `apply_rope`
(rotate_pairs with GCC's FMA, as `ggml_float.fma` rounds it). XLA runs each as a chain
of small fusions per layer; here one pass over the row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.kernels_cpu.build import targets

F32 = jnp.float32


def swiglu_native(g, u, variant: str = "native") -> jax.Array | None:
    """silu(g) · u of f32 arrays of one shape, as `ggml_ops.swiglu`; None when it does not
    apply (other dtypes or shapes) or the kernels are not built."""
    if not all(isinstance(a, jax.Array) for a in (g, u)):
        return None
    if g.shape != u.shape or g.dtype != F32 or u.dtype != F32 or g.ndim == 0:
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    out = jax.ShapeDtypeStruct(g.shape, F32)
    return jax.ffi.ffi_call(prefix + "LlamayGgmlSwiglu", out, vmap_method="sequential")(g, u)


def rms_norm_native(x, w, eps: float, variant: str = "native") -> jax.Array | None:
    """`ggml_ops.rms_norm(x, w, eps)` over the last axis (w None or [n]); None when it
    does not apply or the kernels are not built."""
    if not isinstance(x, jax.Array) or x.ndim == 0 or not jnp.issubdtype(x.dtype, jnp.floating):
        return None
    n = x.shape[-1]
    if w is not None and (
        jnp.shape(w) != (n,) or not jnp.issubdtype(jnp.result_type(w), jnp.floating)
    ):
        return None
    if w is not None and jnp.result_type(w) not in (F32, jnp.float16, jnp.bfloat16):
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    wa = jnp.zeros((1,), F32) if w is None else jnp.asarray(w).astype(F32)
    out = jax.ShapeDtypeStruct(x.shape, F32)
    call = jax.ffi.ffi_call(prefix + "LlamayGgmlRmsNorm", out, vmap_method="sequential")
    return call(x.astype(F32), wa, eps=np.float32(eps), has_w=np.int32(w is not None))


def rope_native(x, cos, sin, kind: str, variant: str = "native") -> jax.Array | None:
    """`ggml_ops.apply_rope(x, cos, sin, kind)`: x [B, T, H, D], cos/sin [B, T, n_rot/2];
    None when it does not apply or the kernels are not built."""
    if kind not in ("norm", "neox") or not all(isinstance(a, jax.Array) for a in (x, cos, sin)):
        return None
    if x.ndim != 4 or cos.ndim != 3 or cos.shape != sin.shape:
        return None
    if cos.shape[:2] != x.shape[:2] or 2 * cos.shape[-1] > x.shape[-1]:
        return None
    if not jnp.issubdtype(x.dtype, jnp.floating) or cos.dtype != F32 or sin.dtype != F32:
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    out = jax.ShapeDtypeStruct(x.shape, F32)
    call = jax.ffi.ffi_call(prefix + "LlamayGgmlRope", out, vmap_method="sequential")
    return call(x.astype(F32), cos, sin, neox=np.int32(kind == "neox"))
