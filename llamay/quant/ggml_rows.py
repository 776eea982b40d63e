"""How many of x's rows are real, for llamacpp numerics' choice of ggml kernel.

ggml-cpu chooses a matmul's kernel from the row count of the x it is given (`ne11`:
the tokens of the batch, or the output rows of the LM head): the tiled GEMM from 8
rows (K-quants and i-quants not repacked), tinyBLAS from 2 (float weights, IQ4_NL),
vec_dot below. The kernels round differently, and llamay pads a step's tokens to a
bucket (a 5-token prompt is a 16-row step), so choosing from the padded row count
computes a short prompt with the batch kernel where llama.cpp uses vec_dot.

The step knows the real count only as a traced value. It says so for the rows its
matmuls see, `with real_rows(count, of=n)` (count: int32 scalar; n: the static row
count it describes), and a kernel choice over x of n rows (`choose`) then becomes a
`lax.switch` on the count among the kernels the counts 1..n would pick: each branch is
the static-shape kernel, and one runs. Any other x (the LM head over last rows, MoE
experts, a matmul outside a step) keeps choosing from its own shape.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Hashable, Iterator

import jax
import jax.numpy as jnp

#: The row counts at which one of ggml's choices changes (tinyBLAS from 2, tiled from 8).
THRESHOLDS = (2, 8)

_REAL: contextvars.ContextVar[tuple[jax.Array, int] | None] = contextvars.ContextVar(
    "ggml_real_rows", default=None
)


@contextlib.contextmanager
def real_rows(count: jax.Array | None, of: int) -> Iterator[None]:
    """While tracing inside it, a matmul over x of `of` rows has `count` real rows."""
    token = _REAL.set(None if count is None else (jnp.asarray(count, jnp.int32), int(of)))
    try:
        yield
    finally:
        _REAL.reset(token)


def valid_tokens(positions: jax.Array, capacity: int) -> jax.Array:
    """Which tokens are real: a step's padding has positions past the cache (dropped)."""
    return (positions >= 0) & (positions < capacity)


def count_of(valid: jax.Array) -> jax.Array:
    return valid.sum(dtype=jnp.int32)


def choose(
    x: jax.Array, key_at: Callable[[int], Hashable], make: Callable[[Hashable], Callable]
) -> Callable:
    """The function f(*args) of the kernel ggml runs for x's rows: `key_at(n)` names the
    kernel for n rows, `make(key)` gives its function. With a real count for x's rows
    (`real_rows`) and kernels that differ between 1 and x's row count, a switch on it."""
    n = math.prod(x.shape[:-1])
    real = _REAL.get()
    keys = sorted({min(m, n) for m in (1, *THRESHOLDS, n)})
    picks: list[tuple[int, Hashable]] = []
    for m in keys:
        k = key_at(m)
        if not picks or picks[-1][1] != k:
            picks.append((m, k))
    if real is None or real[1] != n or len(picks) == 1:
        return make(key_at(n))
    count = real[0]
    index = sum((count >= m).astype(jnp.int32) for m, _ in picks[1:])
    branches = [make(k) for _, k in picks]
    return lambda *args: jax.lax.switch(index, branches, *args)


def real_count(x: jax.Array) -> jax.Array | int:
    """How many of x's rows are real: the step's traced count (`real_rows`) or all."""
    return step_rows(math.prod(x.shape[:-1]))


def step_rows(n: int) -> jax.Array | int:
    """How many of a step's n token rows are real (llama.cpp's batch size, which chooses
    its flash attention's path too): the traced count (`real_rows`) or n."""
    real = _REAL.get()
    return real[0] if real is not None and real[1] == n else n


def gemv_tail(x: jax.Array, count: jax.Array | int, f: Callable) -> jax.Array:
    """ggml's repack matmul of x [n, cols] of which `count` rows are real: the GEMM over
    the first count - count % 4 rows, the GEMV over the rest (`forward_mul_mat_one_chunk`
    in repack.cpp). f(x) is the kernel over x's rows: the GEMM from 4 rows, else the GEMV."""
    n = x.shape[0]
    y = f(x)
    if n < 4 or (isinstance(count, int) and count % 4 == 0):
        return y
    g = count - count % 4  # the first GEMV row

    def with_tail(y):
        start = jnp.clip(g, 0, n - 3)
        tail = f(jax.lax.dynamic_slice_in_dim(x, start, 3))  # 3 rows: the GEMV
        rows = start + jnp.arange(3)
        keep = ((rows >= g) & (rows < count))[:, None]
        old = jax.lax.dynamic_slice_in_dim(y, start, 3)
        return jax.lax.dynamic_update_slice_in_dim(y, jnp.where(keep, tail, old), start, 0)

    # only when there is one: a second pass over the weight otherwise (a decode step of 8
    # rows paid it for nothing)
    return jax.lax.cond(g < count, with_tail, lambda y: y, y)
