"""Per-request LoRA adapters in `BatchEngine`: which adapters each row applies, at what scale.

The model's adapters (`llamay.load(..., lora=...)`) sit in the weight pytree, stacked
(`llamay.kernels.lora.LoraMatrix`). Each request names its scale per adapter
(`Request.lora`: {adapter id: scale}, the others 0, as llama-server's per-request `lora`
field; or one scale per adapter; None: the engine's global scales, `set_lora_scales`), and
every step hands the jitted step a [rows, adapters] array of those scales inside the
weights (`row_weights`): one program serves any mix of adapters and none, and a new
scale is a new value, never a recompile. Rows whose scales differ never share prefix KV:
their sequences' prefix-tree key is their setting (`salt`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from llamay.errors import RequestError
from llamay.kernels.lora import adapter_count, load_scales, map_lora


def _scale(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
        raise RequestError(f"{where}: a LoRA scale must be a number, not {v!r}")
    f = float(v)
    if not math.isfinite(f) or abs(f) > 1e6:
        raise RequestError(f"{where}: a LoRA scale must be finite and at most 1e6, not {v!r}")
    return f


def request_scales(lora: Any, n: int, default: np.ndarray) -> tuple[float, ...]:
    """One scale per loaded adapter for a request's `lora`: None (the engine's `default`),
    {id: scale} (the adapters not named: 0) or a sequence of `n` scales."""
    if lora is None:
        return tuple(float(s) for s in default)
    if isinstance(lora, np.ndarray):
        lora = lora.tolist()
    if n == 0 and lora:
        raise RequestError("the request names LoRA adapters, but the model has none loaded")
    out = [0.0] * n
    if isinstance(lora, Mapping):
        for k, v in lora.items():
            if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k < n:
                raise RequestError(f"invalid LoRA adapter id {k!r} (the model has {n}: 0..{n - 1})")
            out[int(k)] = _scale(v, f"lora adapter {k}")
        return tuple(out)
    if isinstance(lora, Sequence) and not isinstance(lora, str | bytes):
        if len(lora) != n:
            raise RequestError(f"lora: {len(lora)} scales given, the model has {n} adapters")
        return tuple(_scale(v, f"lora adapter {i}") for i, v in enumerate(lora))
    raise RequestError(f"lora must be {{adapter id: scale}} or one scale per adapter, not {lora!r}")


RESTORED = ("lora-restored",)  # a restored snapshot's K/V: keyed by the restoring request


def salt(scales: tuple[float, ...]) -> Any:
    """The prefix-tree key of K/V computed with `scales`: None (shared with the base
    model's) when no adapter applies."""
    return ("lora", scales) if any(scales) else None


def row_weights(weights: dict[str, Any], rows: np.ndarray | None) -> dict[str, Any]:
    """The weights with each step row applying its own scales (`rows` [R, N]); unchanged
    when the model has no adapters (`rows` None)."""
    if rows is None:
        return weights
    r = jax.device_put(rows)
    return map_lora(weights, lambda w: dataclasses.replace(w, row_scales=r))


__all__ = ["adapter_count", "load_scales", "request_scales", "row_weights", "salt"]
