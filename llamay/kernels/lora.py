"""LoRA adapters applied without merging: y = W·x + Σₙ cₙ · Bₙ(Aₙ·x) inside the step.

A `LoraMatrix` wraps one weight matrix (any form) with the stacked low-rank factors of N
adapters: `a` [..., N, r, cols], `b` [..., N, n_rows, r] (leading dims: the layer stack),
zero where an adapter leaves this matrix (or a layer) alone, and ranks padded with zeros
to the largest (exact: the padding adds zero products). The coefficient of adapter n is
`gain`[..., n] (llama.cpp's alpha / rank of that tensor, 1 without alpha) times a user
scale: `scale` [N] for every row, or, when `row_scales` [B, N] is given, each batch row's own
scales, so one batch mixes adapters (a row of zeros: none) in one program; changing the
scales or the choice of adapter is new array values, never a recompile.
The dispatcher (`matmul`) adds the delta (`add_delta`) to the base product, the one place every
architecture's matmuls pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from llamay.quant.matrix import Matrix, scan_split

HIGHEST = jax.lax.Precision.HIGHEST


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class LoraMatrix(Matrix):
    base: Matrix
    a: jax.Array  # [..., N, r, cols]
    b: jax.Array  # [..., N, n_rows, r]
    gain: jax.Array  # [..., N]: alpha / rank per adapter (per layer)
    scale: jax.Array  # [N]: the user scales when `row_scales` is None
    row_scales: jax.Array | None = None  # [B, N]: each batch row's scales
    f16: tuple[bool, ...] = field(default=(), metadata=dict(static=True))  # per adapter

    @property
    def ggml_type(self):
        return self.base.ggml_type

    @property
    def numerics(self) -> str:
        return self.base.numerics

    @property
    def cols(self) -> int:
        return self.base.cols

    @property
    def shape(self) -> tuple[int, ...]:
        return self.base.shape

    def layer(self, index):
        def pick(v):
            return jax.lax.dynamic_index_in_dim(v, index, keepdims=False)

        return dataclasses.replace(
            self, base=self.base.layer(index), a=pick(self.a), b=pick(self.b), gain=pick(self.gain)
        )

    def rows(self, ids, dtype=jnp.float32):  # the embedding lookup reads the base only
        return self.base.rows(ids, dtype)

    def dequantize(self, dtype=jnp.float32):
        return self.base.dequantize(dtype)

    def partition_specs(self, spec) -> LoraMatrix:
        row_scales = None if self.row_scales is None else PartitionSpec()
        return dataclasses.replace(
            self,
            base=self.base.partition_specs(spec),
            a=PartitionSpec(),
            b=PartitionSpec(),
            gain=PartitionSpec(),
            scale=PartitionSpec(),
            row_scales=row_scales,
        )

    def on_layer(self, fn):
        return fn(self)

    def scan_parts(self):
        base_part, rebuild = scan_split(self.base)

        def layer_of(part):
            base, a, b, gain = part
            return dataclasses.replace(self, base=rebuild(base), a=a, b=b, gain=gain)

        return (base_part, self.a, self.b, self.gain), layer_of


def coefficients(w: LoraMatrix, batch: int) -> jax.Array:
    """[B, N]: each row's coefficient per adapter."""
    user = (
        w.row_scales
        if w.row_scales is not None
        else jnp.broadcast_to(w.scale, (batch, w.scale.shape[0]))
    )
    if user.shape[0] != batch:
        raise ValueError(f"LoRA row scales are for {user.shape[0]} rows, the batch has {batch}")
    return user * w.gain


def add_delta(y: jax.Array, x: jax.Array, w: LoraMatrix) -> jax.Array:
    """y + Σₙ cₙ · Bₙ(Aₙ·x) for x [B, ..., cols], y = the base product [B, ..., n_rows],
    adapter by adapter in f32 as llama.cpp's `build_lora_mm` adds them. Numerics
    "llamacpp" with an F16 adapter rounds x and A·x to f16 first, as ggml's f16 mul_mat
    does with its activations."""
    lead = x.shape[:-1]
    x3 = x.astype(jnp.float32).reshape(lead[0], -1, x.shape[-1])  # [B, T, cols]
    out = y.reshape(*x3.shape[:2], -1)
    c = coefficients(w, x3.shape[0])  # [B, N]
    ggml = w.numerics == "llamacpp"
    for n, f16 in enumerate(w.f16):
        xn = _f16(x3) if f16 and ggml else x3
        ax = jnp.einsum("btk,rk->btr", xn, w.a[n], precision=HIGHEST)
        ax = _f16(ax) if f16 and ggml else ax
        bax = jnp.einsum("btr,mr->btm", ax, w.b[n], precision=HIGHEST)
        out = out + bax * c[:, n, None, None]
    return out.reshape(y.shape)


def _f16(v: jax.Array) -> jax.Array:
    return v.astype(jnp.float16).astype(jnp.float32)


def map_lora(weights: dict[str, Any], fn) -> dict[str, Any]:
    """The weight pytree with `fn` applied to each adapted matrix (the rest unchanged)."""

    def one(v):
        return fn(v) if isinstance(v, LoraMatrix) else v

    out = {k: one(v) for k, v in weights.items() if k != "layers"}
    out["layers"] = {k: one(v) for k, v in weights["layers"].items()}
    return out


def _first_lora(weights: dict[str, Any]) -> LoraMatrix | None:
    for v in [*weights.values(), *weights["layers"].values()]:
        if isinstance(v, LoraMatrix):
            return v
    return None


def adapter_count(weights: dict[str, Any]) -> int:
    """How many adapters the weight pytree carries (0: none attached)."""
    w = _first_lora(weights)
    return 0 if w is None else w.scale.shape[0]


def load_scales(weights: dict[str, Any]) -> np.ndarray:
    """[N] the scales the weight pytree applies to every row (the load's), a copy."""
    w = _first_lora(weights)
    return np.zeros(0, np.float32) if w is None else np.asarray(w.scale, np.float32).copy()
