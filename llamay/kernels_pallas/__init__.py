"""Pallas kernels, each beside its jnp reference, and their trace-time dispatch.

- `qmatmul`: quantised x @ W.T over the kernel weight layout (`layout.repack`), TPU
  Mosaic and GPU Triton; `qmatmul_mosaic`: the Mosaic GPU (Hopper) decode kernel over
  the same layout; `w4a8`: the int8-activation variant (TPU).
- `paged_attention`: decode attention through page tables (TPU and GPU variants).
- `dispatch`: `matmul` / `paged_attention` pick the kernel or the reference from
  `jax.default_backend()`, `LLAMAY_BACKEND` and, on GPU, `LLAMAY_GPU_KERNELS`.
"""

from llamay.kernels_pallas.dispatch import (
    backend,
    matmul,
    paged_attention,
    paged_kernel_applies,
    repack_weights,
)
from llamay.kernels_pallas.layout import KERNEL_TYPES, PackedWeight, repack

__all__ = [
    "KERNEL_TYPES",
    "PackedWeight",
    "backend",
    "matmul",
    "paged_attention",
    "paged_kernel_applies",
    "repack",
    "repack_weights",
]
