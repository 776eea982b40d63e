"""The matrix protocol: what every weight form offers the rest of llamay.

A weight matrix W [..., n_rows, cols] (leading dims: stacked layers or experts) comes in
several forms, each a pytree dataclass that subclasses `Matrix`:

- `QTensor` (`qtensor`): the GGUF blocks as the file stores them;
- `AffineQTensor` (`cpu_dot`): int8 quants + f32 scales, XLA CPU's fastest exact form;
- `PackedWeight` (`llamay.kernels_pallas.layout`): planes a Pallas tile dequantises;
- `MixedQTensor` (`qtensor`): one layer of a role whose layers differ in GGML type.

What each offers: `shape`, `n_rows`, `cols`, `ggml_type`, `numerics`; `layer(i)` (one
entry of a stacked matrix, by a traced index); `rows(ids)` (the embedding lookup:
only those rows, dequantised); `dequantize()`; `on_layer(fn)` (fn of the concrete
matrix: a MixedQTensor switches over its per-type stacks there, the one `lax.switch`);
`scan_parts()` (what `lax.scan` slices per layer, and how a layer is rebuilt from it);
`partition_specs(spec)` (the same pytree with a `PartitionSpec` per array, for
`llamay.model.sharding`). The product x @ W.T is `llamay.kernels.matmul(x, w)`: the one
dispatcher, which alone looks at the form to pick an implementation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

# spec(n_rows, col_units, ndim, transposed) -> PartitionSpec for one array of a matrix:
# `n_rows` output rows, columns splittable only in `col_units` whole units (blocks, scale
# groups), rows on axis -2 (axis -1 when `transposed`).
SpecFn = Callable[[int, int, int, bool], Any]


def _same(part):
    return part


class Matrix(ABC):
    """The protocol (module docstring). Subclasses are frozen pytree dataclasses."""

    ggml_type: Any  # the GGML type of the values (static)
    numerics: str  # "exact" or "llamacpp" (static)
    cols: int  # the logical row length (a field or a property of each form)

    @property
    @abstractmethod
    def shape(self) -> tuple[int, ...]:
        """The logical shape [..., n_rows, cols]."""

    @property
    def n_rows(self) -> int:
        """Output rows (W's second-to-last dim)."""
        return self.shape[-2]

    @abstractmethod
    def layer(self, index: jax.Array) -> Matrix:
        """One entry of a stacked [L, ...] matrix by a (traced) index."""

    @abstractmethod
    def rows(self, ids: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Only the rows `ids`, dequantised (embedding lookup): [*ids.shape, cols]."""

    @abstractmethod
    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """All of it: [..., n_rows, cols] in `dtype` (inside jit)."""

    @abstractmethod
    def partition_specs(self, spec: SpecFn) -> Matrix:
        """This pytree with a PartitionSpec in place of every array (see `SpecFn`)."""

    def on_layer(self, fn: Callable[[Matrix], Any]) -> Any:
        """fn(the concrete matrix): the matrix itself for every form but MixedQTensor."""
        return fn(self)

    def scan_parts(self) -> tuple[Any, Callable[[Any], Matrix]]:
        """(what `lax.scan` slices along axis 0 per layer, a function rebuilding one
        layer's matrix from that slice)."""
        return self, _same


def is_matrix(leaf) -> bool:
    """Whether a weight-tree entry is a matrix (any form) rather than a plain array."""
    return isinstance(leaf, Matrix)


def scan_split(leaf) -> tuple[Any, Callable[[Any], Any]]:
    """`Matrix.scan_parts` for any weight-tree entry (a plain array is scanned as is)."""
    return leaf.scan_parts() if is_matrix(leaf) else (leaf, _same)
