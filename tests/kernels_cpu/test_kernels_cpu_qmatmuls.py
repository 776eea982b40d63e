"""Several matmuls that read the same x in one native call (`kernels_cpu.qmatmuls`:
q, k, v and gate, up of a decode step) against each product alone: the same kernels per
row, so bit for bit `qmatmul_native` of each (itself within 1e-5 of the f32 dot over
the jnp dequantisation in exact numerics, and in llamacpp numerics bit for bit the ggml
emulation `qtensor.ggml_matmul`: both checked here too), over types (one type, mixed
types as Gemma's Q4_K/Q6_K files have, weights whose dots read different activation
quants) x shapes (rows not a multiple of the tiles) x M = 1..9 and 64; stacks read in
place at a layer; and the dispatcher's fallbacks (LoRA, an i-quant in llamacpp
numerics) equal `matmul` of each."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import acts

from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.kernels_cpu.qmatmuls import qmatmuls_native
from llamay.quant import MixedQTensor, QTensor, qtensor
from llamay.quant.quantize import random_blocks

T = GGMLType


pytestmark = pytest.mark.usefixtures("native_kernels")  # conftest.py


def weight(t, n, k, seed, numerics="exact"):
    if t in (T.F16, T.BF16):  # finite values (random bytes would hold NaNs)
        values = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.02
        bits = values.astype(np.float16) if t == T.F16 else (values.view(np.uint32) >> 16)
        raw = bits.astype(np.uint16 if t == T.BF16 else np.float16).view(np.uint8)
        return QTensor.from_raw(raw.reshape(n, -1), t, numerics)
    return QTensor.from_raw(random_blocks(t, n, k, seed, scales=(0.001, 0.01)), t, numerics)


# (types, rows of each, K): q|k|v of one type (N = 37 and 5: no tile, fewer rows than a
# task), gate|up mixed, Q4_1 as SmolLM2, a 32-element type with a K-quant
GROUPS = [
    ((T.Q4_1, T.Q4_1, T.Q4_1), (64, 37, 5), 576),
    ((T.Q4_K, T.Q6_K), (40, 37), 512),
    ((T.Q5_0, T.Q8_0, T.Q4_K), (24, 8, 9), 256),
    ((T.F16, T.BF16), (33, 3), 64),
]


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 9, 64])
@pytest.mark.parametrize("group", GROUPS, ids=lambda g: "-".join(t.name for t in g[0]))
def test_one_call_equals_each_product_alone(group, m):
    types, rows, k = group
    ws = tuple(weight(t, n, k, i) for i, (t, n) in enumerate(zip(types, rows, strict=True)))
    x = acts(m, k, m)
    got = jax.jit(lambda x, ws: qmatmuls_native(x, ws))(x, ws)
    assert [g.shape for g in got] == [(m, n) for n in rows]
    for w, g in zip(ws, got, strict=True):
        alone = jax.jit(lambda x, w: qmatmul_native(x, w, "exact"))(x, w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(alone))
        want = np.asarray(x, np.float64) @ np.asarray(w.dequantize(jnp.float32), np.float64).T
        scale = np.abs(np.asarray(x)) @ np.abs(np.asarray(w.dequantize(jnp.float32))).T
        assert np.all(np.abs(np.asarray(g) - want) <= 1e-5 * scale + 1e-30)


# llamacpp numerics: weights whose dots read Q8_0 (with Q4_0's and Q5_0's bias sums and
# without), Q8_1 and Q8_K in one call; the repack kernels (Q4_0, Q4_K, Q2_K rows % 8 == 0)
# beside the plain ones
GGML_GROUPS = [
    ((T.Q4_1, T.Q4_1, T.Q4_1), (64, 37, 5), 576),
    ((T.Q4_K, T.Q6_K), (40, 37), 512),
    ((T.Q5_0, T.Q8_0, T.Q4_K), (24, 8, 9), 256),
    ((T.Q4_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q5_K), (16, 13, 24, 11, 3), 768),
    ((T.Q4_0, T.Q4_0), (40, 7), 96),
]


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 6, 7, 8, 9, 64])
@pytest.mark.parametrize("group", GGML_GROUPS, ids=lambda g: "-".join(t.name for t in g[0]))
def test_llamacpp_one_call_equals_each_product_alone_and_the_emulation(group, m):
    types, rows, k = group
    ws = tuple(
        weight(t, n, k, i, "llamacpp") for i, (t, n) in enumerate(zip(types, rows, strict=True))
    )
    import llamay.kernels_cpu as kcpu

    x = acts(m, k, m)
    got = jax.jit(lambda x, ws: kcpu.matmuls(x, ws, "llamacpp"))(x, ws)
    # the Q4_K/Q2_K repacks' GEMM recomputes its last m % 4 rows by the GEMV: alone
    tail = [w.ggml_type in (T.Q4_K, T.Q2_K) and n % 8 == 0 and m > 4 and m % 4 for w, n in
            zip(ws, rows, strict=True)]  # fmt: skip
    if sum(not t for t in tail) < 2:
        return
    assert [g is None for g in got] == [bool(t) for t in tail]
    for w, g, n in zip(ws, got, rows, strict=True):
        if g is None:
            continue
        assert g.shape == (m, n)
        alone = jax.jit(lambda x, w: qmatmul_native(x, w, "llamacpp"))(x, w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(alone))
        want = jax.jit(qtensor.ggml_matmul)(x, w)
        np.testing.assert_array_equal(np.asarray(g), np.asarray(want))


def test_llamacpp_under_a_real_row_count_each_weight_as_alone():
    """A padded step with a traced count of real rows (`ggml_rows.real_rows`): weights
    whose kernel is one for every count (Q4_1, Q4_K at 3 rows) share the call; those whose
    kernel switches on the count (Q6_K's vec_dot / tiled GEMM, the Q4_K repack's GEMV
    tail) go alone; every result equals `kernels.matmul` of each under the same count."""
    from llamay import kernels
    from llamay.quant import ggml_rows

    k = 256
    ws = tuple(weight(t, 40, k, i, "llamacpp") for i, t in enumerate((T.Q4_1, T.Q6_K, T.Q4_K)))
    for pad in (3, 9):
        x = acts(pad, k, pad)

        def run(x, count, fn, pad=pad):
            with ggml_rows.real_rows(count, of=pad):
                return fn(x)

        fused = jax.jit(lambda x, c: run(x, c, lambda x: kernels.matmuls(x, ws)))
        alone = jax.jit(lambda x, c: run(x, c, lambda x: [kernels.matmul(x, w) for w in ws]))
        for count in sorted({1, 2, pad}):
            got, want = fused(x, jnp.int32(count)), alone(x, jnp.int32(count))
            for g, a in zip(got, want, strict=True):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(a))


@pytest.mark.parametrize("numerics", ["exact", "llamacpp"])
def test_leading_dims_and_stacks_read_in_place_at_a_layer(numerics):
    import llamay.kernels_cpu as kcpu

    k, layers = 256, 3
    stacks = [
        QTensor.from_raw(
            np.stack([random_blocks(t, n, k, 7 * s + n) for s in range(layers)]), t, numerics
        )
        for t, n in ((T.Q4_1, 24), (T.Q6_K, 12))
    ]
    x = acts(6, k, 2).reshape(2, 3, k)

    def scanned(x):
        def body(_, i):
            mixed = [MixedQTensor((s,), jnp.int32(0), i) for s in stacks]
            return None, kcpu.matmuls(x, mixed, numerics)

        return jax.lax.scan(body, None, jnp.arange(layers, dtype=jnp.int32))[1]

    got = jax.jit(scanned)(x)
    for s, g in zip(stacks, got, strict=True):
        assert g.shape == (layers, 2, 3, s.data.shape[1])
        for i in range(layers):
            one = QTensor.from_raw(np.asarray(s.data[i]), s.ggml_type, numerics)
            np.testing.assert_array_equal(
                np.asarray(g[i]), np.asarray(qmatmul_native(x, one, numerics))
            )


def test_dispatcher_falls_back_to_each_matmul():
    """An i-quant in llamacpp numerics (its own kernel), a LoRA adapter on one of them, or
    a weight the kernels do not take: `kernels.matmuls` is `kernels.matmul` of each (the
    same numbers)."""
    import llamay.kernels_cpu as kcpu
    from llamay import kernels
    from llamay.kernels.lora import LoraMatrix

    k = 256
    x = acts(3, k, 9)
    ggml = tuple(weight(t, 40, k, i, "llamacpp") for i, t in enumerate((T.IQ4_NL, T.Q6_K)))
    assert kcpu.matmuls(x, ggml, "llamacpp") is None
    for g, w in zip(jax.jit(kernels.matmuls)(x, ggml), ggml, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.jit(kernels.matmul)(x, w)))
    exact = tuple(weight(t, 40, k, i) for i, t in enumerate((T.Q4_1, T.Q4_1)))
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((1, 4, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((1, 40, 4)), jnp.float32)
    one = jnp.ones((1,), jnp.float32)
    lora = LoraMatrix(exact[0], a, b, one, one)
    got = jax.jit(kernels.matmuls)(x, (lora, exact[1]))
    for g, w in zip(got, (lora, exact[1]), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.jit(kernels.matmul)(x, w)))
    # the fused call itself, where it applies
    fused = jax.jit(kernels.matmuls)(x, exact)
    for g, w in zip(fused, exact, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(qmatmul_native(x, w, "exact")))


@pytest.mark.parametrize("numerics", ["exact", "llamacpp"])
def test_mixed_type_stacks_go_in_the_call_at_their_layer(numerics):
    """Gemma's Q4_K_M files mix types across layers in some roles (a two-stack
    MixedQTensor): every stack goes into the one call, the one holding the layer reads
    it, in a layer scan too; each result equals `qmatmul_native` of that layer alone (in
    llamacpp numerics bit for bit: the same ggml kernel per row)."""
    import llamay.kernels_cpu as kcpu

    k, layers = 256, 4
    which = jnp.asarray([1, 0, 0, 1], jnp.int32)
    index = jnp.asarray([0, 0, 1, 1], jnp.int32)
    stacks = tuple(
        QTensor.from_raw(
            np.stack([random_blocks(t, 24, k, 5 * s + t) for s in range(2)]), t, numerics
        )
        for t in (T.Q4_K, T.Q6_K)
    )
    a = weight(T.Q5_0, 16, k, 1, numerics)
    for m in (1, 3, 8):
        x = acts(m, k, m)

        def scanned(x):
            def body(_, part):
                mixed = MixedQTensor(stacks, *part)
                both = kcpu.matmuls(x, (a, mixed), numerics)
                return None, (both, kcpu.matmul(x, mixed, numerics))

            return jax.lax.scan(body, None, (which, index))[1]

        (ys_a, ys_mixed), ys_alone = jax.jit(scanned)(x)
        for i in range(layers):
            s = stacks[int(which[i])]
            one = QTensor.from_raw(np.asarray(s.data[int(index[i])]), s.ggml_type, numerics)
            want = np.asarray(qmatmul_native(x, one, numerics))
            np.testing.assert_array_equal(np.asarray(ys_mixed[i]), want)
            np.testing.assert_array_equal(np.asarray(ys_alone[i]), want)
            np.testing.assert_array_equal(
                np.asarray(ys_a[i]), np.asarray(qmatmul_native(x, a, numerics))
            )
    # a layer no stack holds is an error, not another layer's (or no) product
    nowhere = MixedQTensor(stacks, jnp.int32(len(stacks)), jnp.int32(0))
    with pytest.raises(Exception, match="exactly one stack"):
        np.asarray(kcpu.matmuls(acts(1, k, 1), (a, nowhere), numerics)[1])


def test_the_weights_taken_go_in_one_call_the_others_alone():
    """A LoRA adapter may sit on one projection, and a mixed-type role's stacks may be of
    a type the kernels do not take: the others still go in one call, each result equal to
    `matmul` alone."""
    import llamay.kernels_cpu as kcpu
    from llamay import kernels
    from llamay.kernels.lora import LoraMatrix

    k = 256
    x = acts(2, k, 4)
    a, b = weight(T.Q4_1, 24, k, 1), weight(T.Q4_K, 16, k, 2)
    two = MixedQTensor(
        tuple(QTensor.from_raw(random_blocks(t, 8, k, 3)[None], t) for t in (T.Q4_K, T.Q6_K)),
        jnp.int32(1),
        jnp.int32(0),
    )
    got = kcpu.matmuls(x, (a, two, b), "exact")
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(qmatmul_native(x, a, "exact")))
    np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(qmatmul_native(x, b, "exact")))
    one = QTensor.from_raw(np.asarray(two.stacks[1].data[0]), T.Q6_K)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(qmatmul_native(x, one, "exact")))
    rng = np.random.default_rng(1)
    one = jnp.ones((1,), jnp.float32)
    lora = LoraMatrix(
        weight(T.Q4_1, 40, k, 5),
        jnp.asarray(rng.standard_normal((1, 4, k)), jnp.float32),
        jnp.asarray(rng.standard_normal((1, 40, 4)), jnp.float32),
        one,
        one,
    )
    ws = (a, lora, two, b)
    for g, w in zip(jax.jit(kernels.matmuls)(x, ws), ws, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.jit(kernels.matmul)(x, w)))
