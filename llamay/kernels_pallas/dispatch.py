"""Kernel dispatch, decided at trace time: `matmul` and `paged_attention` run the Pallas
kernel on GPU/TPU and the jnp reference everywhere else (CPU, Metal: Pallas has no
lowering there).

`LLAMAY_BACKEND` (read when a function is traced, so set it before the first call):
  unset / "auto"       Pallas on "gpu"/"tpu" (`jax.default_backend()`), else the reference
  "reference"          the reference everywhere
  "pallas-interpret"   the Pallas kernels in interpret mode on any backend (tests; TPU
                       tiling), "pallas-interpret-gpu" with the GPU kernels' tiling/variant
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from llamay.kernels_pallas.layout import KERNEL_TYPES, PackedWeight, dequantize_packed, repack
from llamay.kernels_pallas.paged_attention import paged_attention_pallas
from llamay.kernels_pallas.qmatmul import HIGHEST, qmatmul_pallas
from llamay.quant import MixedQTensor, QTensor, qmatmul

ENV = "LLAMAY_BACKEND"
CHOICES = ("auto", "reference", "pallas-interpret", "pallas-interpret-gpu")
# Paged attention: the kernel holds T·(H/K) query rows per kv head on chip; longer
# prefill chunks go to the reference.
MAX_PAGED_QUERY_TOKENS = 16


@dataclass(frozen=True)
class Backend:
    pallas: bool
    platform: str = "tpu"  # which kernel variant / tiling: "tpu" or "gpu"
    interpret: bool = False


def backend() -> Backend:
    """The backend to trace with now (module docstring)."""
    choice = os.environ.get(ENV, "auto") or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "reference":
        return Backend(False)
    if choice.startswith("pallas-interpret"):
        return Backend(True, "gpu" if choice.endswith("-gpu") else "tpu", interpret=True)
    platform = jax.default_backend()
    if platform in ("gpu", "cuda", "rocm"):
        return Backend(True, "gpu")
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
        return qmatmul_pallas(x, w, platform=be.platform, interpret=be.interpret)
    if not (be.pallas and _packable(w) and w.data.ndim == 2):
        return qmatmul(x, w)  # incl. the CPU layout (AffineQTensor) and llama.cpp numerics
    return qmatmul_pallas(x, repack(w), platform=be.platform, interpret=be.interpret)


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
