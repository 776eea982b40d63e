"""Pallas kernels, each beside its jnp reference. `llamay.kernels` chooses among them.

- `qmatmul`: quantised x @ W.T over the kernel weight layout (`layout.repack`), TPU
  Mosaic and GPU Triton; `qmatmul_mosaic`: the Mosaic GPU (Hopper) decode kernel over
  the same layout; `w4a8`: the int8-activation variant (TPU).
- `paged_attention`: decode attention through page tables (TPU and GPU variants), and
  the attention references (dense, and paged: gather then dense) that the other
  backends run.
- `layout`: `PackedWeight`, the kernel layout, a form of the matrix protocol.
"""

from llamay.kernels_pallas.layout import KERNEL_TYPES, PackedWeight, repack
from llamay.kernels_pallas.paged_attention import (
    attention_reference,
    gather_pages,
    paged_attention_pallas,
    paged_attention_reference,
)
from llamay.kernels_pallas.qmatmul import qmatmul_pallas, qmatmul_reference

__all__ = [
    "KERNEL_TYPES",
    "PackedWeight",
    "attention_reference",
    "gather_pages",
    "paged_attention_pallas",
    "paged_attention_reference",
    "qmatmul_pallas",
    "qmatmul_reference",
    "repack",
]
