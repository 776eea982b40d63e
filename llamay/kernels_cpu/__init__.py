"""Native CPU kernels behind XLA's typed FFI, each beside its jnp reference.

The dispatcher (`llamay.kernels`) asks these at trace time; `None` means "not handled
here" and the caller falls back to the XLA path (the dispatcher's XLA forms,
`llamay.kernels.paged_reference`).

- `available()`: whether the kernels are built (on first use) and registered.
- `matmul(x, w, numerics)`: x @ W.T for a GGUF-block `QTensor` W, or one layer of
  `MixedQTensor` stacks (read in place at its index).
- `matmuls(x, ws, numerics)`: x @ W.T for several weights reading the same x in one
  call (both numerics), or None (then `matmul` each).
- `paged_attention(q, k_pages, v_pages, page_table, q_pos, layer=None, **kw)`: exact
  attention through page tables read in place (`attention.py`), the arguments of
  `llamay.kernels.paged_reference`.
- `ggml_attention(q, k, v, q_pos, page_table=None, layer=None, **kw)`: numerics="llamacpp"
  attention over a dense cache or pages read in place (`ggml_attention.py`), bit for bit
  `llamay.kernels.ggml_attention.attention`; `ggml_flash_attention(...)` the same with
  llama.cpp's flash attention (-fa on) over an f16 cache, bit for bit
  `llamay.kernels.ggml_attention.flash_attention`.
- `ggml_swiglu(g, u)`, `ggml_rms_norm(x, w, eps)`, `ggml_rope(x, cos, sin, kind)`: those
  llamacpp-numerics layers
  (`ggml_elementwise.py`), bit for bit `llamay.arch.ggml_ops`'.
- `logprob_argmax(logits, picks)`: each row's log-softmax at its picked tokens and its first
  argmax, one pass over the vocabulary (`logprobs.py`; scoring and perplexity);
  `argmax(x)` the first argmax alone (the sampler's greedy pick), `top_k(x, k)` as
  `jax.lax.top_k` (the sampler's view of the best candidates).
"""

from llamay.kernels_cpu.plug import (
    argmax,
    available,
    ggml_attention,
    ggml_flash_attention,
    ggml_rms_norm,
    ggml_rope,
    ggml_swiglu,
    logprob_argmax,
    matmul,
    matmuls,
    paged_attention,
    top_k,
)

__all__ = [
    "argmax",
    "available",
    "ggml_attention",
    "ggml_flash_attention",
    "ggml_rms_norm",
    "ggml_rope",
    "ggml_swiglu",
    "logprob_argmax",
    "matmul",
    "matmuls",
    "paged_attention",
    "top_k",
]
