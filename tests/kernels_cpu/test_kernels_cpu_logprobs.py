"""The native scoring reduction (`llamay.kernels_cpu.logprobs`: each row's log-softmax at
J picked tokens and the first index of its maximum) against an oracle independent of it
and of XLA: numpy's log-softmax in float64 and `np.argmax` (the first occurrence), over
vocabularies of SmolLM2's and Gemma 3's sizes and the edges of the 16-lane loop (1, 15,
16, 17, 33 logits), ties between lanes and within one, rows of -inf (a masked
vocabulary), picks outside the row (clamped); the scalar build agrees; the dispatcher
takes the kernel on CPU and the XLA reference under LLAMAY_CPU_KERNELS=xla, both equal
to the oracle. The sampler's argmax kernel alone (`argmax_native`) against `np.argmax`
over the same edges, with +-inf and NaN rows (0, as the XLA reference gives). A single row
(fewer rows than threads) is split into chunks over the threads: ties and NaNs across
chunks, and the log-softmax of one such row, hold too. The sampler's top-k (`top_k_native`)
against `jax.lax.top_k` on XLA CPU: values and ids equal, over ties, signed zeros, +-inf,
NaNs, -inf-masked rows, ascending rows (every element a new candidate) and one row split
over the threads."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import OTHER_BUILDS

from llamay.kernels import (
    argmax,
    argmax_reference,
    logprob_argmax,
    logprob_argmax_reference,
    top_k,
)
from llamay.kernels_cpu import build
from llamay.kernels_cpu.logprobs import argmax_native, logprob_argmax_native, top_k_native

pytestmark = pytest.mark.usefixtures("native_kernels")


def oracle(x: np.ndarray, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    ls = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    k = np.clip(picks, 0, x.shape[-1] - 1)
    return np.take_along_axis(ls, k, -1), x.argmax(-1)


def _case(rng, shape, scale=4.0, picks_per_row=1):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    picks = rng.integers(0, shape[-1], (*shape[:-1], picks_per_row)).astype(np.int32)
    return x, picks


def _check(x, picks, variant="native"):
    lp, first = logprob_argmax_native(jnp.asarray(x), jnp.asarray(picks), variant=variant)
    want_lp, want_first = oracle(x, picks)
    np.testing.assert_array_equal(np.asarray(first), want_first)
    # f32 logits: the log-probabilities to f32 rounding of the float64 values
    np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
@pytest.mark.parametrize(
    "shape",
    [(1, 1), (3, 15), (4, 16), (2, 17), (5, 33), (7, 1000), (2, 3, 49152), (2, 262144)]
    + [(1, 262144)],  # one row: split over the threads
)
def test_equals_float64_log_softmax(shape, variant):
    rng = np.random.default_rng(shape[-1])
    _check(*_case(rng, shape), variant=variant)
    _check(*_case(rng, shape, picks_per_row=4), variant=variant)  # several answers a row


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
def test_ties_take_the_first_index(variant):
    rng = np.random.default_rng(1)
    x, picks = _case(rng, (6, 100))
    top = x.max() + 1.0
    x[0, [37, 5, 90]] = top  # lanes 5 and 5 of different vectors: the least index wins
    x[1, [21, 20]] = top  # adjacent lanes of one vector
    x[2, [99, 98]] = top  # in the tail past the last full vector
    x[3, [16, 0]] = top  # lane 0 of two vectors
    x[4, :] = 2.5  # all equal
    x[5, [64, 48, 17]] = top
    picks[:, 0] = [5, 20, 98, 0, 0, 17]
    _check(x, picks, variant=variant)


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
def test_masked_vocabulary_and_clamped_picks(variant):
    rng = np.random.default_rng(2)
    x, picks = _case(rng, (3, 70))
    x[:, 10:60] = -np.inf  # a masked span: exp(-inf) adds nothing
    picks[:, 0] = [-3, 69, 500]  # clamped to 0 and V - 1
    _check(x, picks, variant=variant)


def test_dispatcher_native_and_reference_equal_the_oracle(monkeypatch):
    rng = np.random.default_rng(3)
    x, picks = _case(rng, (4, 8, 3000), picks_per_row=3)
    want_lp, want_first = oracle(x, picks)
    for env, kernel in (("native", True), ("xla", False)):
        monkeypatch.setenv(build.ENV, env)
        step = jax.jit(lambda *a: logprob_argmax(*a))  # a fresh trace under each setting
        args = (jnp.asarray(x), jnp.asarray(picks))
        assert ("LlamayLogprobArgmax" in step.lower(*args).as_text()) == kernel
        lp, first = step(*args)
        np.testing.assert_array_equal(np.asarray(first), want_first)
        np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=2e-6, atol=2e-6)
    lp, first = logprob_argmax_reference(jnp.asarray(x), jnp.asarray(picks))
    np.testing.assert_array_equal(np.asarray(first), want_first)
    np.testing.assert_allclose(np.asarray(lp), want_lp, rtol=2e-6, atol=2e-6)


def _argmax_cases(V: int) -> np.ndarray:
    """Rows of V logits: random, integer-valued (ties everywhere), ties at lane edges,
    all -inf, one +inf, a -inf prefix, all equal."""
    rng = np.random.default_rng(V)
    x = (rng.standard_normal((8, V)) * 4).astype(np.float32)
    x[1] = rng.integers(-3, 4, V)
    top = x[2].max() + 1.0
    x[2, [V - 1, V // 2, V // 3]] = top
    x[3] = -np.inf
    x[4, V // 2] = np.inf
    x[5, : V // 2] = -np.inf
    x[6] = 2.5
    x[7, [V - 1, max(V - 9, 0)]] = x[7].max() + 1.0  # in the tail past the last vector
    return x


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
@pytest.mark.parametrize("V", [1, 7, 8, 9, 16, 17, 33, 1000, 49152, 262144])
def test_argmax_is_numpys_first_maximum(V, variant):
    x = _argmax_cases(V)
    got = argmax_native(jnp.asarray(x), variant=variant)
    np.testing.assert_array_equal(np.asarray(got), x.argmax(-1))
    np.testing.assert_array_equal(np.asarray(argmax_reference(jnp.asarray(x))), x.argmax(-1))


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
def test_argmax_of_a_row_with_a_nan_is_0_as_the_reference(variant):
    x = _argmax_cases(40)
    x[0, 5] = np.nan  # in a vector
    x[2, 39] = np.nan  # in the tail
    x[3, :] = np.nan
    want = x.argmax(-1)
    want[[0, 2, 3]] = 0
    got = argmax_native(jnp.asarray(x), variant=variant)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(argmax_reference(jnp.asarray(x))), want)


def test_argmax_dispatcher_takes_the_kernel_on_cpu(monkeypatch):
    x = _argmax_cases(3000).reshape(2, 4, 3000)
    for env, kernel in (("native", True), ("xla", False)):
        monkeypatch.setenv(build.ENV, env)
        step = jax.jit(lambda a: argmax(a))  # a fresh trace under each setting
        assert ("LlamayArgmax" in step.lower(jnp.asarray(x)).as_text()) == kernel
        np.testing.assert_array_equal(np.asarray(step(jnp.asarray(x))), x.argmax(-1))


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
def test_one_row_split_over_the_threads(variant):
    """One row of Gemma 3's vocabulary: the maximum tied in two chunks (the earlier
    wins), in the last chunk's tail, all -inf but one chunk; a NaN in a late chunk."""
    V = 262144
    rng = np.random.default_rng(5)

    def first(x):
        return np.asarray(argmax_native(jnp.asarray(x), variant=variant))

    for place in ([200_000, 40_000], [V - 1], [V // 2 + 3]):
        x = (rng.standard_normal((1, V)) * 4).astype(np.float32)
        x[0, place] = x.max() + 1.0
        np.testing.assert_array_equal(first(x), x.argmax(-1))
        _check(x, rng.integers(0, V, (1, 3)).astype(np.int32), variant=variant)
    x = np.full((1, V), -np.inf, np.float32)
    x[0, 70_000:70_100] = rng.standard_normal(100)
    np.testing.assert_array_equal(first(x), x.argmax(-1))
    _check(x, np.array([[70_050, 5]], np.int32), variant=variant)
    x[0, 250_000] = np.nan
    assert int(first(x)[0]) == 0


def _topk_rows(V: int) -> np.ndarray:
    rng = np.random.default_rng(V + 1)
    x = (rng.standard_normal((7, V)) * 3).astype(np.float32)
    x[1] = rng.integers(-2, 3, V)  # ties everywhere
    x[2, ::3] = -np.inf  # a masked vocabulary
    x[2, 1::3] = 0.0
    x[2, 2::3] = -0.0  # signed zeros: -0 < +0 in XLA's order
    x[3] = np.arange(V, dtype=np.float32)  # ascending: every element beats the kept
    x[4, : V // 2] = np.inf
    x[5, 1::5] = np.nan
    x[6] = -np.inf
    return x


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
@pytest.mark.parametrize(
    ("V", "k"), [(1, 1), (9, 3), (40, 40), (1000, 40), (3000, 512), (49152, 512)]
)
def test_top_k_is_lax_top_k(V, k, variant):
    x = jnp.asarray(_topk_rows(V))
    want_v, want_i = jax.lax.top_k(x, k)
    got_v, got_i = top_k_native(x, k, variant=variant)
    np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
    np.testing.assert_array_equal(
        np.asarray(got_v).view(np.uint32), np.asarray(want_v).view(np.uint32)
    )


@pytest.mark.parametrize("variant", ["native", *OTHER_BUILDS])
def test_top_k_of_one_row_split_over_the_threads(variant):
    V = 262144
    rng = np.random.default_rng(9)
    rows = [
        (rng.standard_normal(V) * 3).astype(np.float32),
        rng.integers(-4, 5, V).astype(np.float32),
    ]
    rows.append(np.arange(V, dtype=np.float32)[::-1].copy())
    for row in rows:
        for k in (1, 40, 512):
            x = jnp.asarray(row[None])
            want_v, want_i = jax.lax.top_k(x, k)
            got_v, got_i = top_k_native(x, k, variant=variant)
            np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
            np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))


def test_top_k_dispatcher_takes_the_kernel_on_cpu(monkeypatch):
    x = jnp.asarray(_topk_rows(3000).reshape(7, 1, 3000))
    want = jax.lax.top_k(x, 64)
    for env, kernel in (("native", True), ("xla", False)):
        monkeypatch.setenv(build.ENV, env)
        step = jax.jit(lambda a: top_k(a, 64))  # a fresh trace under each setting
        assert ("LlamayTopK" in step.lower(x).as_text()) == kernel
        got = step(x)
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
