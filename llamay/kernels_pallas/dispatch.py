"""Kernel dispatch, decided at trace time: `matmul` and `paged_attention` run the Pallas
kernel on GPU/TPU and the jnp reference everywhere else (CPU, Metal: Pallas has no
lowering there).

`LLAMAY_BACKEND` (read when a function is traced, so set it before the first call):
  unset / "auto"       Pallas on "gpu"/"tpu" (`jax.default_backend()`), else the reference
  "reference"          the reference everywhere
  "pallas-interpret"   the Pallas kernels in interpret mode on any backend (tests; TPU
                       tiling), "pallas-interpret-gpu" with the GPU (Triton) kernels'
                       tiling/variant, "pallas-interpret-mosaic-gpu" with the Mosaic GPU
                       kernels (GPU interpret mode) and Triton for the rest

On GPU two Pallas lowerings exist. `LLAMAY_GPU_KERNELS`:
  unset / "auto"       Mosaic GPU on compute capability >= 9.0 (Hopper and newer), Triton
                       below (Mosaic GPU has no pre-Hopper TMA/WGMMA)
  "mosaic" / "triton"  that one whatever the device
Mosaic GPU serves the quantised matmul for decode (rows of x <= `MOSAIC_MAX_ROWS`,
`qmatmul_mosaic`); prefill matmuls and paged attention stay on the Triton kernels until
they have Mosaic GPU versions.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay.kernels_pallas.layout import KERNEL_TYPES, PackedWeight, dequantize_packed, repack
from llamay.kernels_pallas.paged_attention import paged_attention_pallas
from llamay.kernels_pallas.qmatmul import HIGHEST, qmatmul_pallas
from llamay.quant import MixedQTensor, QTensor, qmatmul

ENV = "LLAMAY_BACKEND"
CHOICES = (
    "auto", "reference", "pallas-interpret", "pallas-interpret-gpu", "pallas-interpret-mosaic-gpu"
)  # fmt: skip
GPU_KERNELS_ENV = "LLAMAY_GPU_KERNELS"
GPU_KERNEL_CHOICES = ("auto", "mosaic", "triton")
MOSAIC_MIN_CAPABILITY = (9, 0)  # Hopper: TMA, the Mosaic GPU pipeline's copies
# Paged attention: the kernel holds T·(H/K) query rows per kv head on chip; longer
# prefill chunks go to the reference.
MAX_PAGED_QUERY_TOKENS = 16
# Quantised matmul: x rows up to this take the Mosaic GPU decode kernel (where chosen);
# more (prefill) take the Triton kernel, which reads each weight tile once per 64 rows.
MOSAIC_MAX_ROWS = 8


@dataclass(frozen=True)
class Backend:
    pallas: bool
    platform: str = "tpu"  # which kernel variant / tiling: "tpu" or "gpu"
    interpret: bool = False
    mosaic: bool = False  # GPU: the Mosaic GPU kernels where they exist, else Triton


def gpu_kernels(device=None) -> str:
    """ "mosaic" or "triton": `LLAMAY_GPU_KERNELS`, or for "auto" the device's compute
    capability (default: the first device) against `MOSAIC_MIN_CAPABILITY`."""
    choice = os.environ.get(GPU_KERNELS_ENV, "auto") or "auto"
    if choice not in GPU_KERNEL_CHOICES:
        raise ValueError(
            f"{GPU_KERNELS_ENV}={choice!r} is not one of {', '.join(GPU_KERNEL_CHOICES)}"
        )
    if choice != "auto":
        return choice
    device = device or jax.devices()[0]
    capability = getattr(device, "compute_capability", None)  # e.g. "9.0"; ROCm: "gfx..."
    try:
        major_minor = tuple(int(p) for p in str(capability).split("."))
    except ValueError:
        return "triton"
    return "mosaic" if major_minor >= MOSAIC_MIN_CAPABILITY else "triton"


def backend() -> Backend:
    """The backend to trace with now (module docstring)."""
    choice = os.environ.get(ENV, "auto") or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "reference":
        return Backend(False)
    if choice.startswith("pallas-interpret"):
        gpu = choice.endswith("-gpu")
        return Backend(True, "gpu" if gpu else "tpu", interpret=True, mosaic="mosaic" in choice)
    platform = jax.default_backend()
    if platform in ("gpu", "cuda", "rocm"):
        return Backend(True, "gpu", mosaic=gpu_kernels() == "mosaic")
    if platform == "tpu":
        return Backend(True, "tpu")
    return Backend(False)


def _packable(w) -> bool:
    return isinstance(w, QTensor) and w.numerics == "exact" and w.ggml_type in KERNEL_TYPES


def matmul(x: jax.Array, w) -> jax.Array:
    """x @ W.T for a QTensor, PackedWeight, MixedQTensor or any other weight `qmatmul`
    takes: `llamay.quant.qmatmul` off GPU/TPU, in llama.cpp numerics, for types without a
    kernel and for weights that are not GGUF-block QTensors; else the Pallas kernel,
    repacking a QTensor inside the trace (`repack_weights` once at load saves that)."""
    if isinstance(w, MixedQTensor):
        branches = [lambda x, s=s: matmul(x, s.layer(w.index)) for s in w.stacks]
        return jax.lax.switch(w.which, branches, x)
    be = backend()
    if isinstance(w, PackedWeight):
        if not be.pallas:
            return jnp.einsum("...k,nk->...n", x.astype(jnp.float32), dequantize_packed(w),
                              precision=HIGHEST)  # fmt: skip
        return _kernel_matmul(x, w, be)
    if not (be.pallas and _packable(w) and w.data.ndim == 2):
        return qmatmul(x, w)  # incl. the CPU layout (AffineQTensor) and llama.cpp numerics
    return _kernel_matmul(x, repack(w), be)


def _kernel_matmul(x: jax.Array, w: PackedWeight, be: Backend) -> jax.Array:
    """The Mosaic GPU kernel for decode rows where the backend has it, else Pallas'
    Triton/TPU kernel."""
    rows = math.prod(x.shape[:-1])
    if be.mosaic and rows <= MOSAIC_MAX_ROWS:
        from jax.experimental.pallas import mosaic_gpu as plgpu

        from llamay.kernels_pallas.qmatmul_mosaic import qmatmul_mosaic

        return qmatmul_mosaic(x, w, interpret=plgpu.InterpretGPUParams() if be.interpret else False)
    return qmatmul_pallas(x, w, platform=be.platform, interpret=be.interpret)


def repack_weights(weights: dict) -> dict:
    """A bound weight tree with every matrix the kernels take already in the kernel layout
    (so no step repacks it): the stacked per-layer matrices (also inside MixedQTensors),
    and the output head, which tied models get as a repacked copy of `tok_embd` (the
    embedding lookup keeps the QTensor). Expert stacks stay QTensors (gathered packed)."""

    def pack(w):
        if isinstance(w, MixedQTensor):
            stacks = tuple(repack(s) if _packable(s) else s for s in w.stacks)
            return MixedQTensor(stacks, w.which, w.index)
        return repack(w) if _packable(w) and w.data.ndim == 3 else w

    out = dict(weights)
    out["layers"] = {role: pack(w) for role, w in weights["layers"].items()}
    head = weights.get("output", weights.get("tok_embd"))
    if _packable(head) and head.data.ndim == 2:
        out["output"] = repack(head)
    return out


def paged_kernel_applies(q: jax.Array, *, causal: bool = True, numerics: str = "exact",
                         **_) -> bool:  # fmt: skip
    """Whether `paged_attention` would run the kernel for these arguments (else the
    caller's reference): a Pallas backend, causal attention, exact numerics, a decode-sized
    query block."""
    return (
        backend().pallas and causal and numerics == "exact" and q.shape[1] <= MAX_PAGED_QUERY_TOKENS
    )


def paged_attention(
    q: jax.Array,
    k_pages: jax.Array,
    v_pages: jax.Array,
    page_table: jax.Array,
    q_pos: jax.Array,
    layer: jax.Array | None = None,
    *,
    scale: float,
    window: jax.Array | int | None = None,
    softcap: float | None = None,
    causal: bool = True,
    numerics: str = "exact",
    q_prescaled: bool = False,
) -> jax.Array:
    """The Pallas paged attention with the keywords of `llamay.arch.layers.attention`
    (call it where `paged_kernel_applies`; `q_prescaled` only matters to llama.cpp numerics)."""
    del q_prescaled
    if not paged_kernel_applies(q, causal=causal, numerics=numerics):
        raise ValueError("paged_attention kernel: needs a Pallas backend, causal, exact numerics")
    be = backend()
    return paged_attention_pallas(
        q, k_pages, v_pages, page_table, q_pos, layer,
        scale=scale, window=window, softcap=softcap or None,
        platform=be.platform, interpret=be.interpret,
    )  # fmt: skip
