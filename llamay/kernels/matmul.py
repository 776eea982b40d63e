"""The one matmul dispatcher: x @ W.T for any weight form (`llamay.quant.matrix`),
the implementation chosen at trace time from the backend (`backend.backend()`), the
weight's form and numerics, and x's row count.

    form           numerics   backend                          implementation
    any            any        CPU, auto                        `kernels_cpu.matmul` first;
                                                               on None the rows below
    PackedWeight   exact      Pallas (GPU/TPU, interpret)      "pallas" / "pallas-mosaic-gpu"
    PackedWeight   exact      anything else                    "packed-reference"
    QTensor        llamacpp   any                              "ggml" (ggml's CPU kernels, bit
                                                               for bit: `quant.ggml_matmul`)
    QTensor 2-D    exact      Pallas, type in KERNEL_TYPES     "pallas" / "pallas-mosaic-gpu"
                                                               (repacked inside the trace)
    AffineQTensor  exact      any (bound on CPU only)          "cpu-affine" (`cpu_dot`)
    QTensor 2-D    exact      CPU (not a Pallas kernel)        "cpu-blocks" (`cpu_dot`)
    QTensor        exact      anything else (Metal, stacks)    "reference" (dequantise, dot)

"pallas-mosaic-gpu" (`kernels_pallas.qmatmul_mosaic`) serves rows of x <= `MOSAIC_MAX_ROWS`
where the backend has Mosaic GPU; more rows (prefill) take "pallas"
(`kernels_pallas.qmatmul_pallas`, Triton on GPU, Mosaic on TPU), which reads each weight
tile once per 64 rows. A MixedQTensor is resolved first (`on_layer`: one `lax.switch`
over its stacks), then its layer's matrix goes through this table. A `LoraMatrix`
(`llamay.kernels.lora`) is its base through this table plus the adapters' low-rank delta.
`matmuls(x, ws)`: several weights that read the same x (q, k, v; gate, up), each as
`matmul`, or on CPU by one native call for all (`kernels_cpu.matmuls`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from llamay import kernels_cpu
from llamay.errors import UnsupportedTensorTypeError
from llamay.kernels.backend import Backend, backend, device_kind
from llamay.kernels.lora import LoraMatrix
from llamay.kernels.lora import add_delta as add_lora
from llamay.kernels_pallas import KERNEL_TYPES, PackedWeight, repack
from llamay.kernels_pallas.layout import dequantize_packed
from llamay.kernels_pallas.qmatmul import HIGHEST, qmatmul_pallas
from llamay.quant import AffineQTensor, MixedQTensor, QTensor
from llamay.quant.cpu_dot import affine_matmul, blocks_matmul
from llamay.quant.matrix import Matrix
from llamay.quant.qtensor import dequant_matmul, ggml_matmul

# Quantised matmul: x rows up to this take the Mosaic GPU decode kernel (where chosen).
MOSAIC_MAX_ROWS = 8


def matmul(x: jax.Array, w: Matrix) -> jax.Array:
    """x @ W.T for x [..., cols] and W [rows, cols] in any form: [..., rows] in f32 (the
    one matmul every architecture calls; module docstring for what runs where)."""
    if isinstance(w, LoraMatrix):  # adapters beside the weight, never merged into it
        return add_lora(matmul(x, w.base), x, w)
    be = backend()
    if be.native and isinstance(w, MixedQTensor):  # the native kernels read it in place
        y = kernels_cpu.matmul(x, w, w.numerics)
        if y is not None:
            return y
    return w.on_layer(lambda m: _matmul_one(x, m, be))


def matmuls(x: jax.Array, ws: tuple[Matrix, ...]) -> tuple[jax.Array, ...]:
    """(x @ W.T for each W in `ws`): `matmul` of each, the same numbers; on CPU one
    native call for all the Ws the kernels take (`kernels_cpu.matmuls`: the
    projections of a decode step that read the same x, run with one handoff to the
    threads instead of one per matrix; a LoRA-adapted one goes through `matmul`)."""
    ws, ys = tuple(ws), {}
    if backend().native:
        plain = [i for i, w in enumerate(ws) if not isinstance(w, LoraMatrix)]
        numerics = {getattr(ws[i], "numerics", None) for i in plain}
        if len(plain) > 1 and len(numerics) == 1:
            got = kernels_cpu.matmuls(x, [ws[i] for i in plain], numerics.pop())
            ys = dict(zip(plain, got, strict=True)) if got is not None else {}
    return tuple(matmul(x, w) if ys.get(i) is None else ys[i] for i, w in enumerate(ws))


def _matmul_one(x: jax.Array, w: Matrix, be: Backend) -> jax.Array:
    if be.native:
        y = kernels_cpu.matmul(x, w, w.numerics)
        if y is not None:
            return y
    return IMPLEMENTATIONS[matmul_choice(x, w, be)](x, w, be)


def kernel_takes(w: Matrix) -> bool:
    """Whether a GGUF-block weight has a Pallas kernel (exact numerics, a kernel type)."""
    return isinstance(w, QTensor) and w.numerics == "exact" and w.ggml_type in KERNEL_TYPES


def matmul_choice(x: jax.Array, w: Matrix, be: Backend | None = None) -> str:
    """The name of the implementation (module docstring) `matmul` runs for this concrete
    weight when no native kernel takes it."""
    be = backend() if be is None else be
    if isinstance(w, PackedWeight) or (be.pallas and kernel_takes(w) and w.data.ndim == 2):
        if not be.pallas:
            return "packed-reference"
        decode = math.prod(x.shape[:-1]) <= MOSAIC_MAX_ROWS
        return "pallas-mosaic-gpu" if be.mosaic and decode else "pallas"
    if isinstance(w, AffineQTensor):
        return "cpu-affine"
    if isinstance(w, QTensor):
        if w.numerics == "llamacpp":
            return "ggml"
        return "cpu-blocks" if w.data.ndim == 2 and device_kind() == "cpu" else "reference"
    raise UnsupportedTensorTypeError(f"no matmul for the weight form {type(w).__name__}")


def _packed(w) -> PackedWeight:
    return repack(w) if isinstance(w, QTensor) else w


def _pallas(x, w, be: Backend):
    return qmatmul_pallas(x, _packed(w), platform=be.platform, interpret=be.interpret)


def _pallas_mosaic_gpu(x, w, be: Backend):
    # Imported here: the Mosaic GPU modules load only where that kernel is chosen.
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from llamay.kernels_pallas.qmatmul_mosaic import qmatmul_mosaic

    interpret = plgpu.InterpretGPUParams() if be.interpret else False
    return qmatmul_mosaic(x, _packed(w), interpret=interpret)


def _packed_reference(x, w: PackedWeight, be: Backend):
    wf = dequantize_packed(w)
    return jnp.einsum("...k,nk->...n", x.astype(jnp.float32), wf, precision=HIGHEST)


IMPLEMENTATIONS = {
    "pallas": _pallas,
    "pallas-mosaic-gpu": _pallas_mosaic_gpu,
    "packed-reference": _packed_reference,
    "ggml": lambda x, w, be: ggml_matmul(x, w),
    "cpu-affine": lambda x, w, be: affine_matmul(x, w),
    "cpu-blocks": lambda x, w, be: blocks_matmul(x, w.data, w.ggml_type, w.cols),
    "reference": lambda x, w, be: dequant_matmul(x, w),
}
