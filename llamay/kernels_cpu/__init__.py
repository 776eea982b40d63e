"""Native CPU kernels behind XLA's typed FFI, each beside its jnp reference.

The dispatcher (`llamay.kernels`) asks these at trace time; `None` means "not handled
here" and the caller falls back to the XLA path (`llamay.quant.qmatmul`,
`llamay.arch.paged.paged_attention`).

- `matmul(x, w, numerics)`: x @ W.T for a GGUF-block `QTensor` W.
- `paged_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw)`: decode
  attention through page tables, the arguments of `llamay.arch.paged.paged_attention`.
"""

from __future__ import annotations

import jax


def matmul(x: jax.Array, w, numerics: str) -> jax.Array | None:
    """x @ W.T by a native kernel, or None when none applies (the caller uses XLA)."""
    del x, w, numerics
    return None


def paged_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw) -> jax.Array | None:
    """Paged decode attention by a native kernel, or None when none applies."""
    del q, k_pages, v_pages, page_table, q_pos, layer, kw
    return None
