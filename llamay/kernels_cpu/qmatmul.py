"""The native quantised matmul y = x @ W.T over GGUF block rows, beside its reference.

Reference: `llamay.quant.qmatmul` (exact: f32 dot over `dequantize_jnp`; llamacpp:
`qtensor.ggml_matmul`, the XLA emulation of ggml's kernels, which these kernels equal
bit for bit). The kernels (`src/qmatmul_exact.cc`, `src/qmatmul_ggml.cc`):

- exact, every type the loader accepts: f32 register tiles over weight rows dequantised
  into a small buffer (values bit-exact; only the summation order differs); on CPUs with
  AMX-BF16, 16+ rows of the integer-quant types through the tile unit, x split exactly
  into three bf16 pieces (each product exact, f32 sums).
- llamacpp, the 32-element types and the K-quants: the kernel takes the f32 activations
  and quantises them to Q8_0 / Q8_1 / Q8_K once per call as `llamay.quant.act_quant` does
  (ggml's x86 quantize_row_*, bit for bit), then ggml's integer dots (VNNI where the CPU
  has it) and f32 accumulation order. The kernel is chosen from the weight type and x's
  row count as `qtensor._ggml_kernel` chooses it. On AVX-512 VNNI, 8+ rows take
  transposed tiles (16 weight rows per register, ggml's per-lane or per-sub-block f32
  operations for 16 outputs at once): the same operations per output, so the same bits.
- llamacpp, F16/BF16 (`src/qmatmul_ggml_float.cc`): x rounded to f16/bf16, then
  tinyBLAS' (2+ rows) or ggml_vec_dot_f16/bf16's (one row) lanes and sums in their order,
  as `ggml_float` emulates them. F32 weights in llamacpp numerics keep the reference.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.build import targets
from llamay.kernels_cpu.qmatmul_iq import IQ_DOT_TYPES, qmatmul_iq_native
from llamay.quant import QTensor, ggml_rows

_T = GGMLType
#: The i-quants, ternary types and MXFP4: src/blocks.h's iq_parts over the grids build.py
#: generates from llamay.quant.iq_tables (llamacpp numerics: `qmatmul_iq`).
IQ_TYPES = (_T.IQ4_NL, _T.IQ4_XS, _T.MXFP4, _T.TQ1_0, _T.TQ2_0, _T.IQ2_XXS, _T.IQ2_XS)
IQ_TYPES += (_T.IQ2_S, _T.IQ3_XXS, _T.IQ3_S, _T.IQ1_S, _T.IQ1_M)
EXACT_TYPES = frozenset(
    (_T.F32, _T.F16, _T.BF16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0)
    + (_T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K)
    + IQ_TYPES
)
Q8_TYPES = frozenset((_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0))
K_TYPES = frozenset((_T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K))
FLOAT_TYPES = frozenset((_T.F16, _T.BF16))  # llamacpp numerics (F32: the reference)
K_VEC, K_TILED, K_REPACK = 0, 1, 2  # src/qmatmul_ggml.cc's KKernel


def applies(x: jax.Array, w, numerics: str, layer: jax.Array | None = None) -> bool:
    """Whether a native kernel computes x @ W.T (trace time; the build aside): a QTensor
    [rows, cols], or a stack [L, rows, cols] with the `layer` to use."""
    if not isinstance(w, QTensor) or w.data.ndim != (2 if layer is None else 3):
        return False
    if x.shape[-1] != w.cols:
        return False
    types = EXACT_TYPES if numerics == "exact" else Q8_TYPES | K_TYPES | FLOAT_TYPES
    types = types if numerics == "exact" else types | frozenset(IQ_DOT_TYPES)
    return w.ggml_type in types and math.prod(x.shape[:-1]) > 0


def _call(prefix: str, name: str, x_lead, n: int, *args, **attrs) -> jax.Array:
    out = jax.ShapeDtypeStruct((math.prod(x_lead), n), jnp.float32)
    # "sequential": under vmap (MoE experts) the handler sees one problem per call; it reads
    # its operands as unbatched [rows, cols] buffers
    call = jax.ffi.ffi_call(prefix + name, out, vmap_method="sequential")
    return call(*args, **{k: np.int32(v) for k, v in attrs.items()}).reshape(*x_lead, n)


def qmatmul_native(
    x: jax.Array, w: QTensor, numerics: str, *, layer: jax.Array | None = None,
    variant: str = "native", batched: bool | None = None,
) -> jax.Array | None:  # fmt: skip
    """x [..., cols] @ W.T by the native kernel, or None when none applies or the
    kernels are unavailable (`build.targets`). W is [rows, cols], or with `layer` (an
    int32 scalar, traced) a stack [L, rows, cols] read in place: a layer scan then passes
    the stack, where a sliced operand would be copied out per layer. `batched` as
    `qtensor.ggml_matmul`'s."""
    if not applies(x, w, numerics, layer):
        return None
    prefix = targets(variant)
    if prefix is None:
        return None
    lead, k = x.shape[:-1], x.shape[-1]
    n_rows = w.data.shape[-2]
    layer = jnp.zeros((), jnp.int32) if layer is None else jnp.asarray(layer, jnp.int32)
    data = (w.data, layer)
    t = w.ggml_type
    if numerics == "exact":
        x2 = x.astype(jnp.float32).reshape(-1, k)
        return _call(prefix, "LlamayQmmExact", lead, n_rows, x2, *data, ggml_type=t)
    if t in IQ_DOT_TYPES:  # `qmatmul_iq`: src/qmatmul_ggml_iq.cc
        return qmatmul_iq_native(x, w, prefix, layer, batched)
    x2 = x.astype(jnp.float32).reshape(-1, k)  # quantised in the kernel, as act_quant does
    if t in FLOAT_TYPES:  # tinyBLAS from 2 real rows (as qtensor._ggml_kernel), else vec_dot
        step = 32 if t == _T.BF16 else 16

        def float_call(sgemm: bool):
            return lambda x2, *data: _call(prefix, "LlamayQmmGgmlFloat", x2.shape[:1], n_rows,
                                           x2, *data, ggml_type=t, batched=sgemm)  # fmt: skip

        def sgemm_at(n: int) -> bool:
            return n >= 2 and n_rows % 4 == 0 and k % step == 0

        if batched is not None:
            y = float_call(sgemm_at(8 if batched else 1))(x2, *data)
        else:
            y = ggml_rows.choose(x, sgemm_at, float_call)(x2, *data)
        return y.reshape(*lead, n_rows)
    if t in Q8_TYPES:
        name, attr, kernel = ggml_static_kernel(x, t, n_rows)
        return _call(prefix, name, lead, n_rows, x2, *data, ggml_type=t, **{attr: kernel})

    def kernel_at(n: int) -> int:
        return _k_kernel(t, n_rows, n)

    def call(kernel: int):
        return lambda x2, *data: _call(prefix, "LlamayQmmQ8K", x2.shape[:1], n_rows, x2, *data,
                                       ggml_type=t, kernel=kernel)  # fmt: skip

    if batched is not None:
        y = call(kernel_at(8 if batched else 1))(x2, *data)
    elif kernel_at(1) == K_REPACK:  # its GEMM's last count % 4 rows: the GEMV
        repack = call(K_REPACK)
        y = ggml_rows.gemv_tail(x2, ggml_rows.real_count(x), lambda x2: repack(x2, *data))
    else:
        y = ggml_rows.choose(x, kernel_at, call)(x2, *data)  # the real row count's kernel
    return y.reshape(*lead, n_rows)


def _k_kernel(t, n_rows: int, n: int) -> int:
    if t in (_T.Q2_K, _T.Q4_K) and n_rows % 8 == 0:
        return K_REPACK
    return K_TILED if n >= 8 else K_VEC


def ggml_static_kernel(x: jax.Array, t, n_rows: int) -> tuple[str, str, int] | None:
    """The llamacpp-numerics handler, kernel attribute and kernel for a Q8_TYPES / K_TYPES
    weight of `n_rows` rows over x, where one kernel serves all of x's rows whatever the
    step's real row count (`ggml_rows`); None where it depends on that count (the
    K-quants' vec_dot or tiled GEMM under a count, the Q4_K/Q2_K repack's GEMV tail)."""
    if t in Q8_TYPES:  # whole_block: the Q4_0x8 repack GEMV/GEMM
        return "LlamayQmmQ8", "whole_block", int(t == _T.Q4_0 and n_rows % 8 == 0)
    n = math.prod(x.shape[:-1])
    kernel = _k_kernel(t, n_rows, n)
    counted = not isinstance(ggml_rows.real_count(x), int)
    if kernel == K_REPACK:  # the GEMV alone below 4 rows; no tail for all n real, n % 4 == 0
        return ("LlamayQmmQ8K", "kernel", K_REPACK) if n < 4 or not (counted or n % 4) else None
    if counted and kernel != _k_kernel(t, n_rows, 1):
        return None
    return "LlamayQmmQ8K", "kernel", kernel
