"""The native quantised matmul against its references: exact numerics within 1e-5 of
the f32 dot over the jnp dequantisation (llamay.quant, itself checked against gguf-py),
llamacpp numerics bit for bit equal to the XLA emulation of ggml's kernels
(`qtensor.ggml_matmul`, which the llama.cpp goldens hold), over types x shapes: K one
block and many, N not a multiple of the 4-row tile nor of 8 (ggml's vec/tiled kernels)
and a multiple of 8 (its repack kernels), M = 1..9 and 64 (exact: also 37 and 130, the
prefill tiles; on AMX hosts 16 rows and up take the tile unit; llamacpp numerics on
AVX-512 VNNI: 8 rows and up take the transposed tiles, 16-row groups and a tail). The
portable scalar build equals the SIMD one. (The i-quants, TQ* and MXFP4:
test_kernels_cpu_iquants.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import OTHER_BUILDS, acts, assert_close_sums, exact_reference

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.qmatmul import (
    EXACT_TYPES,
    FLOAT_TYPES,
    IQ_TYPES,
    K_TYPES,
    Q8_TYPES,
    qmatmul_native,
)
from llamay.quant import QTensor, qtensor
from llamay.quant.quantize import random_blocks

T = GGMLType
MS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 64]
#: Prefill rows past the exact kernel's tiles of x rows (16 on AVX2, 32 on AVX-512): a
#: partial tile after several whole ones.
PREFILL_MS = [37, 130]
#: Rows short of a panel block, through the decode tiles in groups of x rows.
GROUPED_MS = [16, 23]


pytestmark = pytest.mark.usefixtures("native_kernels")  # conftest.py


def block(t: GGMLType) -> int:
    return 256 if t in K_TYPES else 32 if t in Q8_TYPES else 1


def shapes(t: GGMLType) -> list[tuple[int, int]]:
    """(N rows, K cols): one block and many; N = 37 (no tile or group of 8) and 40."""
    if block(t) == 1:
        return [(37, 37), (40, 300)]
    return [(37, block(t)), (40, block(t) * 5), (37, block(t) * 7)]


def weight(t: GGMLType, n: int, k: int, numerics: str, seed: int = 0) -> QTensor:
    raw = random_blocks(t, n, k, seed, scales=(0.001, 0.01))
    if t in (T.F16, T.BF16):  # finite values (random bytes would hold NaNs)
        values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.02
        bits = (
            values.astype(np.float16).view(np.uint16)
            if t == T.F16
            else values.view(np.uint32) >> 16
        )
        raw = bits.astype(np.uint16).view(np.uint8).reshape(n, -1)
    return QTensor.from_raw(raw, t, numerics)


@pytest.mark.parametrize("m", MS + GROUPED_MS + PREFILL_MS)
@pytest.mark.parametrize("t", sorted(EXACT_TYPES - set(IQ_TYPES)), ids=lambda t: t.name)
def test_exact_matches_the_f32_dot_of_the_dequantised_weight(t, m):
    for n, k in shapes(t):
        w, x = weight(t, n, k, "exact"), acts(m, k, m)
        got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "exact"))(x, w))
        want = np.asarray(jax.jit(exact_reference)(x, w), np.float64)
        assert_close_sums(got, want, x, w, (t.name, n, k))


@pytest.mark.parametrize("m", MS + PREFILL_MS)
@pytest.mark.parametrize("t", sorted(Q8_TYPES | K_TYPES), ids=lambda t: t.name)
def test_llamacpp_is_bit_identical_to_the_ggml_emulation(t, m):
    for n, k in shapes(t):
        w, x = weight(t, n, k, "llamacpp", seed=n), acts(m, k, m + 100)
        got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "llamacpp"))(x, w))
        want = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
        np.testing.assert_array_equal(got, want, err_msg=f"{t.name} N={n} K={k}")


# (N, K) of float weights: tinyBLAS needs N % 4 == 0 and K % 16 (BF16: 32) == 0, else
# vec_dot (ggml_vec_dot_*: 64-wide steps, the rest in double); K = 96: 64 + one more chunk
FLOAT_SHAPES = [(37, 37), (40, 300), (40, 96), (44, 576), (37, 160), (8, 32)]


@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("t", sorted(FLOAT_TYPES), ids=lambda t: t.name)
def test_llamacpp_float_weights_are_bit_identical_to_the_ggml_emulation(t, m):
    for n, k in FLOAT_SHAPES:
        w, x = weight(t, n, k, "llamacpp", seed=n), acts(m, k, m + 100)
        got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "llamacpp"))(x, w))
        want = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
        np.testing.assert_array_equal(got, want, err_msg=f"{t.name} N={n} K={k}")


@pytest.mark.parametrize("t", sorted(FLOAT_TYPES), ids=lambda t: t.name)
def test_llamacpp_float_weights_scalar_build_equals_the_emulation(t):
    for n, k in FLOAT_SHAPES:
        for m in (1, 3):
            w, x = weight(t, n, k, "llamacpp", seed=n), acts(m, k, m)
            want = np.asarray(jax.jit(qtensor.ggml_matmul)(x, w))
            scalar = qmatmul_native(x, w, "llamacpp", variant="scalar")
            np.testing.assert_array_equal(np.asarray(scalar), want, err_msg=f"N={n} K={k} M={m}")


@pytest.mark.parametrize("t", [T.Q8_0, T.Q6_K, T.F16, T.BF16], ids=lambda t: t.name)
def test_batched_flag_picks_the_one_row_or_batch_kernel_as_the_emulation(t):
    n, k = 37, 512
    w, x = weight(t, n, k, "llamacpp"), acts(3, k, 7)
    for batched in (False, True):
        got = jax.jit(lambda x, w, b=batched: qmatmul_native(x, w, "llamacpp", batched=b))(x, w)
        want = jax.jit(lambda x, w, b=batched: qtensor.ggml_matmul(x, w, b))(x, w)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_leading_dims_are_rows():
    t, n, k = T.Q4_1, 24, 64
    w, x = weight(t, n, k, "exact"), acts(6, k, 3).reshape(2, 3, k)
    got = qmatmul_native(x, w, "exact")
    assert got.shape == (2, 3, n)
    want = np.asarray(exact_reference(x.reshape(6, k), w))
    np.testing.assert_allclose(np.asarray(got).reshape(6, n), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", OTHER_BUILDS)
@pytest.mark.parametrize("numerics", ["exact", "llamacpp"])
@pytest.mark.parametrize("t", sorted(Q8_TYPES | K_TYPES), ids=lambda t: t.name)
def test_other_builds_equal_the_simd_build(t, numerics, variant):
    """The portable build and (x86) the AVX2 one against this CPU's: every tile shape of
    the llamacpp kernels: M = 1 (one row), 3 (4-row tiles), 9 (8 activation rows, then 1);
    N = 40 takes the 8-row Q4_0 repack tiles, 37 the odd rows."""
    for n, k in shapes(t):
        for m in (1, 3, 9):
            w, x = weight(t, n, k, numerics), acts(m, k, m)
            simd = np.asarray(qmatmul_native(x, w, numerics))
            scalar = np.asarray(qmatmul_native(x, w, numerics, variant=variant))
            if numerics == "llamacpp":  # integer sums, then the same f32 operations per lane
                np.testing.assert_array_equal(scalar, simd)
            else:
                assert_close_sums(scalar, simd, x, w, (t.name, n, k, m))


def test_what_is_not_handled_returns_none():
    w = weight(T.F32, 8, 64, "llamacpp")  # F32 weights in llamacpp numerics: the reference
    assert qmatmul_native(acts(1, 64, 0), w, "llamacpp") is None
    stacked = QTensor(jnp.zeros((2, 8, 36), jnp.uint8), T.Q8_0, 64)
    assert qmatmul_native(acts(1, 64, 0), stacked, "exact") is None


@pytest.mark.parametrize("numerics", ["exact", "llamacpp"])
def test_a_stack_read_in_place_under_a_layer_scan_equals_each_layer_alone(numerics):
    """`layer` reads one entry of a stacked [L, rows, cols] weight where it lies (a scan
    over the layers passes the whole stack: no per-layer copy), and a MixedQTensor
    of such stacks goes through `kernels_cpu.matmul` the same way."""
    import llamay.kernels_cpu as kcpu
    from llamay.quant import MixedQTensor

    n, k, layers = 24, 256, 3
    stacks = [
        QTensor.from_raw(
            np.stack([random_blocks(t, n, k, 10 * i + s) for s in range(layers)]), t, numerics
        )  # fmt: skip
        for i, t in enumerate((T.Q4_1, T.Q6_K))
    ]
    x = acts(2, k, 5)
    which = jnp.asarray([0, 1, 1, 0], jnp.int32)
    index = jnp.asarray([2, 0, 1, 0], jnp.int32)

    def scanned(x):
        def body(_, wi):
            return None, kcpu.matmul(x, MixedQTensor(tuple(stacks), *wi), numerics)

        return jax.lax.scan(body, None, (which, index))[1]

    got = np.asarray(jax.jit(scanned)(x))
    for j, (s, i) in enumerate(zip([0, 1, 1, 0], [2, 0, 1, 0], strict=True)):
        w = stacks[s]
        one = QTensor.from_raw(np.asarray(w.data[i]), w.ggml_type, numerics)
        np.testing.assert_array_equal(got[j], np.asarray(qmatmul_native(x, one, numerics)))
    with pytest.raises(Exception, match="layer index out of range"):
        np.asarray(qmatmul_native(x, stacks[0], numerics, layer=jnp.int32(layers)))


def test_prefill_of_every_type_is_native():
    """Prefill rows go to the native kernels in both numerics, the nibble types included
    (exact Q4_0/Q4_1 prefill went to XLA's dequantise-and-dot until the panel GEMM beat
    it: SmolLM2 Q4_1 pp128 313-352 -> 417-430 tok/s on an AVX2 host, load 0.8): the
    plug point returns the kernel's own numbers."""
    import llamay.kernels_cpu as kcpu

    k = 256
    x = acts(64, k, 3)
    for t in (T.Q4_0, T.Q4_1, T.Q6_K):
        for numerics in ("exact", "llamacpp"):
            w = QTensor.from_raw(random_blocks(t, 16, k, int(t)), t, numerics)
            got = kcpu.matmul(x, w, numerics)
            assert got is not None, (t, numerics)
            np.testing.assert_array_equal(
                np.asarray(got), np.asarray(qmatmul_native(x, w, numerics))
            )


@pytest.mark.parametrize("t", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_many_weight_rows_per_task(t):
    """Weight rows past one task's first groups: the AMX loop's chunks of 8 groups of 16
    rows (a task of 1,200 rows on 2 threads holds several, the last one partial) and the
    transposed llamacpp tiles' 16-row groups over many tasks."""
    n, k = 1200, 256
    x = acts(40, k, 7)
    w = weight(t, n, k, "exact", seed=3)
    got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "exact"))(x, w))
    want = np.asarray(jax.jit(exact_reference)(x, w), np.float64)
    assert_close_sums(got, want, x, w, (t.name, n, k))
    w = weight(t, n, k, "llamacpp", seed=3)
    got = np.asarray(jax.jit(lambda x, w: qmatmul_native(x, w, "llamacpp"))(x, w))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(qtensor.ggml_matmul)(x, w)))
