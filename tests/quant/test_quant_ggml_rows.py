"""Kernel choice by the real row count (`llamay.quant.ggml_rows`): a padded x whose step
says how many rows are real is computed, row for row, as the unpadded x alone (the kernel
ggml picks for that many rows), with the count traced (one program for every count), in
the XLA emulation and the native kernels alike. Which kernel ggml runs for a count, and
that each equals llama.cpp, is held by tests/quant/test_quant_types_llamacpp.py's goldens
(prompts of 1..16 tokens); here: that the switch runs the right one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import acts

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu import build
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.quant import QTensor, ggml_rows
from llamay.quant.qtensor import ggml_matmul
from llamay.quant.quantize import random_blocks

T = GGMLType
PAD = 16
# (type, weight rows): the tiled GEMM from 8 rows (i-quants, K-quants not repacked),
# tinyBLAS from 2 (IQ4_NL with rows % 8 != 0, F16), the Q4_K/Q2_K repack (its GEMV for
# the last count % 4 rows), and Q8_0: one kernel for every count.
CASES = [(T.IQ4_XS, 40), (T.IQ3_S, 40), (T.Q6_K, 40), (T.Q3_K, 40), (T.IQ4_NL, 36)]
CASES += [(T.F16, 40), (T.BF16, 40), (T.Q4_K, 40), (T.Q2_K, 40), (T.Q8_0, 40)]


def weight(t: GGMLType, n: int, k: int) -> QTensor:
    if t in (T.F16, T.BF16):
        values = np.random.default_rng(n).normal(0, 0.05, (n, k)).astype(np.float32)
        bits = (
            values.astype(np.float16).view(np.uint16)
            if t == T.F16
            else values.view(np.uint32) >> 16
        )
        raw = bits.astype(np.uint16).view(np.uint8).reshape(n, -1)
        return QTensor.from_raw(raw, t, "llamacpp")
    return QTensor.from_raw(random_blocks(t, n, k, n + k, scales=(-0.01, 0.01)), t, "llamacpp")


def padded(fn):
    """fn(x, w) over x padded to PAD rows, `count` of them real: one jitted program."""

    @jax.jit
    def run(x, w, count):
        with ggml_rows.real_rows(count, of=PAD):
            return fn(x, w)

    return run


IMPLS = [(impl, t, n) for impl in ("xla", "native") for t, n in CASES]


@pytest.mark.parametrize("impl,t,n", IMPLS, ids=lambda c: getattr(c, "name", str(c)))
def test_padded_rows_are_computed_as_the_real_rows_alone(t, n, impl, monkeypatch):
    monkeypatch.setenv(build.ENV, "native")
    k = 512
    w, x = weight(t, n, k), acts(PAD, k, 7)
    fn = ggml_matmul if impl == "xla" else (lambda x, w: qmatmul_native(x, w, "llamacpp"))
    run = padded(fn)
    differs = False
    for count in (1, 2, 5, 7, 9, 16):
        alone = np.asarray(jax.jit(fn)(x[:count], w))
        got = np.asarray(run(x, w, jnp.int32(count)))
        np.testing.assert_array_equal(got[:count], alone, err_msg=f"{t.name} {count} rows")
        differs |= not np.array_equal(np.asarray(jax.jit(fn)(x, w))[:count], alone)
    assert run._cache_size() == 1  # the count is traced: one program
    # where the kernel changes with the row count, padding alone would change rows
    assert differs == (t != T.Q8_0), t.name


def test_a_count_for_other_rows_is_ignored():
    w, x = weight(T.IQ4_XS, 40, 256), acts(4, 256, 3)
    with ggml_rows.real_rows(jnp.int32(1), of=PAD):  # not x's 4 rows: its own count
        got = np.asarray(jax.jit(ggml_matmul)(x, w))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(ggml_matmul)(x, w)))
