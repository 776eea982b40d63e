"""The dispatcher: one matmul and one attention entry point, each choosing its
implementation at trace time from `jax.default_backend()`, `LLAMAY_BACKEND` and the
numerics (design principle 4).

- `matmul(x, w)`: x @ W.T for every weight form of the matrix protocol
  (`llamay.quant.matrix`): Pallas kernels on GPU/TPU, native kernels then XLA's forms on
  CPU, the jnp references elsewhere (`matmul` module's table); `matmuls(x, ws)` several
  that read the same x (one native call for them all on CPU).
- `attention(q, k, v, q_pos, page_table=..., ...)`: dense or paged, reference / Pallas /
  native (`attention` module's table).
- `logprob_argmax(logits, picks)`: each row's log-softmax at its picked tokens and its
  first argmax (scoring; native on CPU, `logprobs` module); `argmax(x)` the first argmax
  alone (the sampler's greedy pick); `top_k(x, k)` as `jax.lax.top_k`.
- `LoraMatrix`: a weight with LoRA adapters beside it, unmerged (`lora` module).
- `backend()`: what the environment and platform choose (`backend` module).
- `weight_form(numerics)`: which form `llamay.model.bind` gives quantised matrices;
  `repack_weights`: a bound tree in the Pallas kernels' layout (`forms`).
"""

from llamay.kernels.attention import (
    MAX_PAGED_QUERY_TOKENS,
    attention,
    attention_choice,
    dense_reference,
    paged_reference,
)
from llamay.kernels.backend import (
    CHOICES,
    ENV,
    GPU_KERNELS_ENV,
    Backend,
    backend,
    device_kind,
    gpu_kernels,
)
from llamay.kernels.forms import FORMS, native_weights, repack_weights, weight_form
from llamay.kernels.logprobs import (
    argmax,
    argmax_reference,
    logprob_argmax,
    logprob_argmax_reference,
    top_k,
)
from llamay.kernels.lora import LoraMatrix
from llamay.kernels.matmul import (
    MOSAIC_MAX_ROWS,
    kernel_takes,
    matmul,
    matmul_choice,
    matmuls,
)

__all__ = [
    "CHOICES",
    "ENV",
    "FORMS",
    "GPU_KERNELS_ENV",
    "MAX_PAGED_QUERY_TOKENS",
    "MOSAIC_MAX_ROWS",
    "Backend",
    "LoraMatrix",
    "argmax",
    "argmax_reference",
    "attention",
    "attention_choice",
    "backend",
    "dense_reference",
    "device_kind",
    "gpu_kernels",
    "kernel_takes",
    "logprob_argmax",
    "logprob_argmax_reference",
    "matmul",
    "matmul_choice",
    "matmuls",
    "native_weights",
    "paged_reference",
    "repack_weights",
    "top_k",
    "weight_form",
]
