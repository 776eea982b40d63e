"""Binding GGUF tensors into an architecture's weight pytree.

Matrices stay quantised as `QTensor`s (device copies of the packed GGUF blocks);
1-D tensors (norms, biases) become f32 arrays. Per-layer tensors are stacked
along a leading layer axis for `lax.scan`; when a role's layers differ in GGML
type they become a `MixedQTensor` (per-type stacks plus a per-layer choice).

Which form quantised matrices take is decided in one place, `llamay.kernels.weight_form`
(per backend and numerics): on XLA's CPU backend, in exact numerics, they are repacked at
load into `AffineQTensor`s (int8 quants + f32 scales: what XLA CPU dequantises fastest,
see `llamay.quant.cpu_dot`), whatever the device count (`llamay.model.sharding` places
every form on a mesh). Where the Pallas kernels run (GPU/TPU, or LLAMAY_BACKEND=
pallas-interpret), the matrices they take are repacked once here into their layout
(`llamay.kernels.repack_weights`), so no step repacks them per trace.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from llamay import kernels
from llamay.arch.base import Architecture
from llamay.errors import ModelFormatError
from llamay.gguf import GGUFFile
from llamay.quant import AffineQTensor, MixedQTensor, QTensor
from llamay.quant.cpu_dot import repackable
from llamay.quant.np_dequant import dequantize


def _small(gf: GGUFFile, name: str) -> np.ndarray:
    info = gf.tensors[name]
    return dequantize(gf.raw(name), info.ggml_type).reshape(info.shape)


def default_repack(numerics: str) -> bool:
    """Whether `bind` repacks into `AffineQTensor`s by default (`kernels.weight_form`)."""
    return kernels.weight_form(numerics) == "affine"


def _matrix(raw: np.ndarray, ggml_type, numerics: str, repack: bool):
    """A [rows, row_bytes] matrix or a stack of them ([L, rows, row_bytes]): repacked
    when asked and its type has the affine form; expert stacks stay GGUF blocks."""
    if repack and raw.ndim <= 3 and repackable(ggml_type):
        return AffineQTensor.from_raw(raw, ggml_type)
    return QTensor.from_raw(raw, ggml_type, numerics)


def _single(gf: GGUFFile, name: str, numerics: str, repack: bool = False):
    info = gf.tensors[name]
    if len(info.ne) == 1:  # device_put: jnp.asarray(ndarray) compiles a program per shape
        return jax.device_put(_small(gf, name))
    return _matrix(gf.raw(name), info.ggml_type, numerics, repack and len(info.ne) == 2)


def _stacked(gf: GGUFFile, names: list[str], numerics: str, repack: bool = False):
    infos = [gf.tensors[n] for n in names]
    shapes = {i.shape for i in infos}
    if len(shapes) != 1:
        raise ModelFormatError(f"{gf.path}: per-layer tensors differ in shape: {sorted(shapes)}")
    if len(infos[0].ne) == 1:
        return jax.device_put(np.stack([_small(gf, n) for n in names]))
    types = list(dict.fromkeys(i.ggml_type for i in infos))
    repack = repack and len(infos[0].ne) == 2
    if len(types) == 1:
        return _matrix(np.stack([gf.raw(n) for n in names]), types[0], numerics, repack)
    stacks, which, index = [], [], []
    for t in types:
        members = [n for n, i in zip(names, infos, strict=True) if i.ggml_type == t]
        stacks.append(_matrix(np.stack([gf.raw(n) for n in members]), t, numerics, repack))
    seen: dict = {}
    for info in infos:
        which.append(types.index(info.ggml_type))
        index.append(seen.get(info.ggml_type, 0))
        seen[info.ggml_type] = index[-1] + 1
    which, index = jax.device_put((np.asarray(which, np.int32), np.asarray(index, np.int32)))
    return MixedQTensor(tuple(stacks), which, index)


def bind(
    gf: GGUFFile,
    arch: Architecture,
    n_layers: int,
    numerics: str = "exact",
    repack: bool | None = None,
) -> dict[str, Any]:
    """The weight pytree: {role: tensor, ..., "layers": {role: stacked tensor}}.

    `numerics` ("exact" or "llamacpp") is stored in every QTensor: it decides how
    the matmul computes with that weight (see `llamay.quant.qtensor`). `repack`:
    quantised matrices as `AffineQTensor`s (exact numerics only); None means the form of
    `kernels.weight_form(numerics)`: "affine" repacks so, "packed" gives the matrices the
    Pallas kernels take in their layout (`kernels.repack_weights`); False: the GGUF
    blocks as they are.
    """
    form = kernels.weight_form(numerics) if repack is None else None
    kernel_layout = form == "packed"
    if repack is None:
        repack = form == "affine"
    if repack and numerics != "exact":
        raise ValueError(f"repacked weights compute in exact numerics only, not {numerics!r}")
    weights: dict[str, Any] = {}
    layers: dict[str, Any] = {}
    for spec in arch.tensors:
        names = [spec.name.format(i=i) for i in range(n_layers)] if spec.per_layer else [spec.name]
        missing = [n for n in names if n not in gf.tensors]
        if missing:
            if spec.optional and len(missing) == len(names):
                continue
            raise ModelFormatError(
                f"{gf.path}: the {arch.name} architecture needs tensor {missing[0]!r}, "
                "which the file lacks"
            )
        if spec.per_layer:
            layers[spec.role] = _stacked(gf, names, numerics, repack)
        else:
            weights[spec.role] = _single(gf, names[0], numerics, repack)
    weights["layers"] = layers
    if kernel_layout:
        weights = kernels.repack_weights(weights)
    if form == "native":
        weights = kernels.native_weights(weights)
    return weights
