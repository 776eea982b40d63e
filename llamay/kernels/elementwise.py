"""The llamacpp-numerics layers with a native CPU kernel (`llamay.kernels_cpu`), asked at
trace time by `llamay.arch.ggml_ops` before its XLA emulation (the reference, which
this room may not import): None means "run the emulation" (not on CPU, not built,
LLAMAY_BACKEND=reference, LLAMAY_CPU_KERNELS=xla, an input the kernel does not take).

    ggml_swiglu(g, u)         ggml_ops.swiglu     SwiGLU with ggml_v_expf
    ggml_rms_norm(x, w, eps)  ggml_ops.rms_norm   Σx² in double, 1/sqrt(mean + eps)
    ggml_rope(x, cos, sin, k) ggml_ops.apply_rope rotate_pairs with GCC's FMA
"""

from __future__ import annotations

import jax

from llamay import kernels_cpu
from llamay.kernels.backend import backend


def ggml_swiglu(g: jax.Array, u: jax.Array) -> jax.Array | None:
    return kernels_cpu.ggml_swiglu(g, u) if backend().native else None


def ggml_rms_norm(x: jax.Array, w, eps: float) -> jax.Array | None:
    return kernels_cpu.ggml_rms_norm(x, w, eps) if backend().native else None


def ggml_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, kind: str) -> jax.Array | None:
    return kernels_cpu.ggml_rope(x, cos, sin, kind) if backend().native else None
