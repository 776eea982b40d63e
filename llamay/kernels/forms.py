"""Which weight form `llamay.model.bind` gives quantised matrices, per backend and
numerics: the one place that decides it (`weight_form`), and the repack into the Pallas
kernels' layout (`repack_weights`).
"""

from __future__ import annotations

import jax
import numpy as np

from llamay import kernels_cpu
from llamay.kernels.backend import backend, device_kind
from llamay.kernels.matmul import kernel_takes
from llamay.kernels_pallas import repack
from llamay.quant import MixedQTensor, QTensor

FORMS = ("blocks", "affine", "packed", "native")


def weight_form(numerics: str) -> str:
    """ "packed": the Pallas kernels' layout (`kernels_pallas.PackedWeight`), where they
    run (GPU/TPU, or forced by LLAMAY_BACKEND=pallas-interpret*), exact numerics;
    "affine": `quant.AffineQTensor` (int8 quants + f32 scales, what XLA CPU dequantises
    fastest) on the CPU backend, exact numerics, when the native kernels are not there;
    "native": the GGUF blocks with per-layer stacks as one-stack MixedQTensors
    (`native_weights`), on the CPU backend with the native kernels (`kernels_cpu`), both
    numerics; "blocks": the GGUF blocks (`QTensor`) everywhere else: llama.cpp numerics,
    Metal."""
    if device_kind() == "cpu" and backend().native and kernels_cpu.available():
        return "native"
    if numerics != "exact":
        return "blocks"
    if backend().pallas:
        return "packed"
    if device_kind() == "cpu":
        return "affine"
    return "blocks"


def native_weights(weights: dict) -> dict:
    """A bound weight tree whose per-layer QTensor stacks [L, rows, bytes] are one-stack
    MixedQTensors: the layer scan then closes over the stack and scans only the layer
    index, and the native kernels read each layer where it lies (a scanned stack is
    sliced, and XLA copies a slice out before a custom call takes it)."""

    def wrap(w):
        if not (isinstance(w, QTensor) and w.data.ndim == 3):
            return w
        n = w.data.shape[0]
        which, index = jax.device_put((np.zeros(n, np.int32), np.arange(n, dtype=np.int32)))
        return MixedQTensor((w,), which, index)

    return dict(weights, layers={role: wrap(w) for role, w in weights["layers"].items()})


def repack_weights(weights: dict) -> dict:
    """A bound weight tree with every matrix the kernels take already in the kernel layout
    (so no step repacks it): the stacked per-layer matrices (also inside MixedQTensors),
    and the output head, which tied models get as a repacked copy of `tok_embd` (the
    embedding lookup keeps the QTensor). Expert stacks stay QTensors (gathered packed)."""

    def pack(w):
        if isinstance(w, MixedQTensor):
            stacks = tuple(repack(s) if kernel_takes(s) else s for s in w.stacks)
            return MixedQTensor(stacks, w.which, w.index)
        return repack(w) if kernel_takes(w) and w.data.ndim == 3 else w

    out = dict(weights)
    out["layers"] = {role: pack(w) for role, w in weights["layers"].items()}
    head = weights.get("output", weights.get("tok_embd"))
    if kernel_takes(head) and head.data.ndim == 2:
        out["output"] = repack(head)
    return out
