"""The native llamacpp-numerics matmul of the i-quants, TQ1_0/TQ2_0 and MXFP4
(src/qmatmul_ggml_iq.cc) bit for bit equal to the XLA emulation of ggml's kernels
(`quant.ggml_iq_dot` through `qtensor.ggml_matmul`, which tests/quant/
test_quant_types_llamacpp.py holds to llama.cpp's logits), over types x shapes: K one
block and many (an odd number of 32-blocks: IQ4_NL/MXFP4's vec_dot pairs them), N = 37
(ggml's vec_dot / tinyBLAS) and 40 (IQ4_NL/MXFP4's 8x8 repack), M = 1..9 and 64 (the
tiled GEMM from 8 rows on). The portable scalar build equals the SIMD one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import acts

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.qmatmul import IQ_TYPES, qmatmul_native
from llamay.quant import QTensor, qtensor
from llamay.quant.ggml_iq_dot import Q8_0_TYPES, kernel_for
from llamay.quant.quantize import random_blocks

T = GGMLType
MS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 64]


pytestmark = pytest.mark.usefixtures("native_kernels")  # conftest.py


def shapes(t: GGMLType) -> list[tuple[int, int]]:
    """(N rows, K cols): one block and many (even and odd counts), N = 37 and 40."""
    b = 32 if t in Q8_0_TYPES else 256
    return [(37, b), (40, b * 6), (37, b * 7)]


def weight(t: GGMLType, n: int, k: int, seed: int) -> QTensor:
    raw = random_blocks(t, n, k, seed, scales=(-0.01, 0.01))
    rng = np.random.default_rng(seed)
    if t == T.MXFP4:  # e8m0 exponents near 2^0 (random ones overflow f32 dots)
        raw[:, ::17] = rng.integers(118, 130, raw[:, ::17].shape)
    if t == T.IQ1_M:  # its f16 d, kept in the top nibbles of the four scale words: finite
        blocks = raw.reshape(n, -1, 56)
        d = rng.uniform(0.002, 0.01, blocks.shape[:2]).astype(np.float16).view(np.uint16)
        for i in range(4):
            nib = ((d >> (4 * i)) & 0xF).astype(np.uint8)
            blocks[..., 49 + 2 * i] = (blocks[..., 49 + 2 * i] & 0x0F) | (nib << 4)
    return QTensor.from_raw(raw, t, "llamacpp")


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_llamacpp_is_bit_identical_to_the_ggml_emulation(t, m):
    for n, k in shapes(t):
        w, x = weight(t, n, k, seed=n + k), acts(m, k, m + 100)
        got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "llamacpp"))(x, w))
        want = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
        assert np.isfinite(want).all() and np.abs(want).max() > 0
        np.testing.assert_array_equal(got, want, err_msg=f"{t.name} N={n} K={k} M={m}")


@pytest.mark.parametrize("t", IQ_TYPES, ids=lambda t: t.name)
def test_scalar_build_equals_the_simd_build(t):
    for n, k in shapes(t):
        for m in (1, 9):
            w, x = weight(t, n, k, seed=3), acts(m, k, m)
            simd = np.asarray(qmatmul_native(x, w, "llamacpp"))
            scalar = np.asarray(qmatmul_native(x, w, "llamacpp", variant="scalar"))
            np.testing.assert_array_equal(scalar, simd)


@pytest.mark.parametrize("t", [T.IQ2_XS, T.IQ4_NL, T.TQ1_0], ids=lambda t: t.name)
def test_batched_flag_picks_the_one_row_or_batch_kernel_as_the_emulation(t):
    n, k = 37, 512
    w, x = weight(t, n, k, seed=1), acts(3, k, 7)
    for batched in (False, True):
        got = jax.jit(lambda x, w, b=batched: qmatmul_native(x, w, "llamacpp", batched=b))(x, w)
        want = jax.jit(lambda x, w, b=batched: qtensor.ggml_matmul(x, w, b))(x, w)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_kernel_choice_is_ggml_cpus():
    """ggml-cpu (x86): the tiled GEMM for the i-quants but IQ4_NL from 8 rows; TQ always
    vec_dot; IQ4_NL/MXFP4 the 8x8 repack for rows % 8 == 0, else IQ4_NL tinyBLAS from 2."""
    assert kernel_for(T.IQ2_XXS, 37, 8) == "tiled" and kernel_for(T.IQ2_XXS, 40, 7) == "vec"
    assert kernel_for(T.IQ4_XS, 40, 64) == "tiled" and kernel_for(T.TQ2_0, 40, 64) == "vec"
    assert kernel_for(T.IQ4_NL, 40, 1) == "repack" and kernel_for(T.MXFP4, 40, 64) == "repack"
    assert kernel_for(T.IQ4_NL, 37, 2) == "tinyblas" and kernel_for(T.IQ4_NL, 37, 1) == "vec"
    assert kernel_for(T.MXFP4, 37, 64) == "vec"


def test_a_stack_read_in_place_equals_each_layer_alone():
    t, n, k = T.IQ3_S, 16, 512
    layers = [random_blocks(t, n, k, seed, scales=(-0.01, 0.01)) for seed in range(3)]
    stack = QTensor.from_raw(np.stack(layers), t, "llamacpp")
    x = acts(2, k, 5)
    for i, raw in enumerate(layers):
        got = qmatmul_native(x, stack, "llamacpp", layer=jnp.int32(i))
        want = qtensor.ggml_matmul(x, QTensor.from_raw(raw, t, "llamacpp"))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
