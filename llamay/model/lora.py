"""LoRA adapters from llama.cpp's GGUF files, attached to a bound weight tree unmerged.

An adapter file (`convert_lora_to_gguf.py`'s output) has `general.type = adapter`,
`adapter.type = lora`, `adapter.lora.alpha`, the base model's `general.architecture`, and
per adapted matrix `<name>.lora_a` (ggml ne [cols, r]: numpy [r, cols]) and `<name>.lora_b`
(ne [r, rows]: numpy [rows, r]), so the update is W + s·B·A with s = user scale × alpha / r
(just the user scale when alpha is 0), as llama.cpp's `build_lora_mm` computes it.
`attach` wraps each adapted matrix of the tree in a `llamay.kernels.lora.LoraMatrix`
holding every adapter's factors stacked (zeros where one leaves a matrix alone); the
scales are arrays (`with_scales`, `with_rows`): no recompile to change them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from llamay.arch.base import Architecture
from llamay.errors import AdapterError
from llamay.gguf import GGUFFile
from llamay.gguf.constants import GGMLType
from llamay.kernels.lora import LoraMatrix, map_lora
from llamay.quant.np_dequant import dequantize

SUFFIX_A, SUFFIX_B = ".lora_a", ".lora_b"


@dataclass(frozen=True)
class Adapter:
    """One adapter file: alpha and, per base tensor name, (A [r, cols], B [rows, r]) f32."""

    path: Path
    alpha: float
    factors: dict[str, tuple[np.ndarray, np.ndarray]]
    f16: bool  # stored as F16 (ggml rounds the activations to f16 for its products)


def _tensor(gf: GGUFFile, name: str) -> np.ndarray:
    info = gf.tensors[name]
    return dequantize(gf.raw(name), info.ggml_type).reshape(info.shape).astype(np.float32)


def _field(gf: GGUFFile, key: str, want: str, path) -> None:
    got = gf.metadata.get(key)
    if got != want:
        raise AdapterError(f"{path}: {key} is {got!r}, a LoRA adapter has {want!r}")


def read_adapter(path: str | os.PathLike, base: GGUFFile) -> Adapter:
    """An adapter file, checked against the base model's file (architecture, each
    tensor's base and shapes, as llama.cpp's adapter loader checks them)."""
    path = Path(path)
    if not path.is_file():
        raise AdapterError(f"{path}: no such LoRA adapter file")
    gf = GGUFFile(path)
    _field(gf, "general.type", "adapter", path)
    _field(gf, "adapter.type", "lora", path)
    if gf.architecture != base.architecture:
        raise AdapterError(
            f"{path}: general.architecture is {gf.architecture!r}, the model's is "
            f"{base.architecture!r}"
        )
    names = list(gf.tensors)
    odd = [n for n in names if not n.endswith((SUFFIX_A, SUFFIX_B))]
    if odd:
        raise AdapterError(f"{path}: tensor {odd[0]!r} is neither a .lora_a nor a .lora_b")
    factors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    types = set()
    for name in names:
        if not name.endswith(SUFFIX_A):
            continue
        target = name[: -len(SUFFIX_A)]
        if target + SUFFIX_B not in gf.tensors:
            raise AdapterError(f"{path}: {name!r} has no {target + SUFFIX_B!r}")
        if target not in base.tensors:
            raise AdapterError(f"{path}: the model has no tensor {target!r} to adapt")
        ia, ib, iw = gf.tensors[name], gf.tensors[target + SUFFIX_B], base.tensors[target]
        if len(iw.ne) != 2 or len(ia.ne) != 2 or len(ib.ne) != 2:
            raise AdapterError(
                f"{path}: {target!r}: LoRA on {len(iw.ne)}-D tensors is not supported"
            )
        if ia.ne[0] != iw.ne[0] or ib.ne[1] != iw.ne[1]:
            raise AdapterError(
                f"{path}: {target!r}: lora_a ne {list(ia.ne)} / lora_b ne {list(ib.ne)} do not "
                f"fit the model's ne {list(iw.ne)} (want [{iw.ne[0]}, r] and [r, {iw.ne[1]}])"
            )
        if ia.ne[1] != ib.ne[0]:
            raise AdapterError(
                f"{path}: {target!r}: lora_a ne {list(ia.ne)} and lora_b ne {list(ib.ne)} "
                "differ in rank (lora_a must not be transposed)"
            )
        factors[target] = (_tensor(gf, name), _tensor(gf, target + SUFFIX_B))
        types |= {ia.ggml_type, ib.ggml_type}
    unpaired = [n for n in names if n.endswith(SUFFIX_B) and n[: -len(SUFFIX_B)] not in factors]
    if unpaired:
        raise AdapterError(f"{path}: {unpaired[0]!r} has no .lora_a")
    if not factors:
        raise AdapterError(f"{path}: the adapter has no tensors")
    alpha = float(gf.metadata.get("adapter.lora.alpha", 0.0))
    return Adapter(path, alpha, factors, f16=GGMLType.F16 in types)


def _targets(arch: Architecture, n_layers: int) -> dict[str, tuple[str, int | None]]:
    """GGUF tensor name -> (role, layer or None) for every matrix the tree binds."""
    out: dict[str, tuple[str, int | None]] = {}
    for spec in arch.tensors:
        if spec.every_layer:
            continue
        if "{i}" in spec.name:
            out.update({spec.name.format(i=i): (spec.role, i) for i in range(n_layers)})
        else:
            out[spec.name] = (spec.role, None)
    return out


def attach(
    weights: dict[str, Any],
    arch: Architecture,
    n_layers: int,
    adapters: list[Adapter],
    scales: list[float],
) -> dict[str, Any]:
    """The tree with every adapted matrix a `LoraMatrix` over all `adapters` (each row
    applies them all, adapter n at `scales[n]`, until `with_rows` says otherwise)."""
    if len(scales) != len(adapters):
        raise ValueError("one scale per adapter")
    targets = _targets(arch, n_layers)
    touched: dict[str, list] = {}
    for ad in adapters:
        for name in ad.factors:
            if name not in targets:
                raise AdapterError(f"{ad.path}: {name!r} is not a matrix the model multiplies by")
            touched.setdefault(targets[name][0], []).append(name)
    f16 = tuple(ad.f16 for ad in adapters)
    n = len(adapters)
    scale = np.asarray(scales, np.float32)
    layers = dict(weights["layers"])
    out = dict(weights)
    for role in touched:
        per_layer = role in layers
        base = layers[role] if per_layer else weights[role]
        rows, cols = base.shape[-2], base.shape[-1]
        pairs = [(targets[t][1], i, ad.factors[t]) for i, ad in enumerate(adapters)
                 for t in ad.factors if targets[t][0] == role]  # fmt: skip
        r = max(a.shape[0] for _, _, (a, _) in pairs)
        lead = (n_layers,) if per_layer else ()
        a_st = np.zeros((*lead, n, r, cols), np.float32)
        b_st = np.zeros((*lead, n, rows, r), np.float32)
        gain = np.zeros((*lead, n), np.float32)
        for layer, i, (a, b) in pairs:
            at = (layer, i) if per_layer else (i,)
            a_st[at][: a.shape[0]] = a
            b_st[at][:, : a.shape[0]] = b
            alpha = adapters[i].alpha
            gain[at] = alpha / a.shape[0] if alpha else 1.0
        a_d, b_d, g_d, s_d = jax.device_put((a_st, b_st, gain, scale))
        wrapped = LoraMatrix(base, a_d, b_d, g_d, s_d, None, f16)
        if per_layer:
            layers[role] = wrapped
        else:
            out[role] = wrapped
    out["layers"] = layers
    return out


def with_scales(weights: dict[str, Any], scales) -> dict[str, Any]:
    """Every row applies adapter n at `scales[n]` (0: off)."""
    s = jax.device_put(np.asarray(scales, np.float32))
    return map_lora(weights, lambda w: dataclasses.replace(w, scale=s, row_scales=None))


def with_rows(weights: dict[str, Any], rows) -> dict[str, Any]:
    """Batch row b applies adapter n at `rows[b][n]` (a row of zeros: the base model);
    one program serves any mix of adapters and scales for that batch size."""
    r = jax.device_put(np.asarray(rows, np.float32))
    return map_lora(weights, lambda w: dataclasses.replace(w, row_scales=r))
