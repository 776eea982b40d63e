"""Binding GGUF tensors into an architecture's weight pytree.

Matrices stay quantised as `QTensor`s (device copies of the packed GGUF blocks);
1-D tensors (norms, biases) become f32 arrays. Per-layer tensors are stacked
along a leading layer axis for `lax.scan`; when a role's layers differ in GGML
type they become a `MixedQTensor` (per-type stacks plus a per-layer choice).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from llamay.arch.base import Architecture
from llamay.errors import ModelFormatError
from llamay.gguf import GGUFFile
from llamay.quant import MixedQTensor, QTensor
from llamay.quant.np_dequant import dequantize


def _small(gf: GGUFFile, name: str) -> np.ndarray:
    info = gf.tensors[name]
    return dequantize(gf.raw(name), info.ggml_type).reshape(info.shape)


def _single(gf: GGUFFile, name: str, numerics: str):
    info = gf.tensors[name]
    if len(info.ne) == 1:
        return jnp.asarray(_small(gf, name))
    return QTensor.from_raw(gf.raw(name), info.ggml_type, numerics)


def _stacked(gf: GGUFFile, names: list[str], numerics: str):
    infos = [gf.tensors[n] for n in names]
    shapes = {i.shape for i in infos}
    if len(shapes) != 1:
        raise ModelFormatError(f"{gf.path}: per-layer tensors differ in shape: {sorted(shapes)}")
    if len(infos[0].ne) == 1:
        return jnp.asarray(np.stack([_small(gf, n) for n in names]))
    types = list(dict.fromkeys(i.ggml_type for i in infos))
    if len(types) == 1:
        return QTensor.from_raw(np.stack([gf.raw(n) for n in names]), types[0], numerics)
    stacks, which, index = [], [], []
    for t in types:
        members = [n for n, i in zip(names, infos, strict=True) if i.ggml_type == t]
        stacks.append(QTensor.from_raw(np.stack([gf.raw(n) for n in members]), t, numerics))
    seen: dict = {}
    for info in infos:
        which.append(types.index(info.ggml_type))
        index.append(seen.get(info.ggml_type, 0))
        seen[info.ggml_type] = index[-1] + 1
    return MixedQTensor(tuple(stacks), jnp.asarray(which, jnp.int32), jnp.asarray(index, jnp.int32))


def bind(
    gf: GGUFFile, arch: Architecture, n_layers: int, numerics: str = "exact"
) -> dict[str, Any]:
    """The weight pytree: {role: tensor, ..., "layers": {role: stacked tensor}}.

    `numerics` ("exact" or "llamacpp") is stored in every QTensor: it decides how
    `qmatmul` computes with that weight (see `llamay.quant.qtensor`).
    """
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
            layers[spec.role] = _stacked(gf, names, numerics)
        else:
            weights[spec.role] = _single(gf, names[0], numerics)
    weights["layers"] = layers
    return weights
