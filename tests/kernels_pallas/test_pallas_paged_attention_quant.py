"""The Pallas paged attention kernels over quantised KV pages (q8_0, q5_1, q5_0, q4_1,
q4_0: uint8 rows of GGUF blocks, dequantised tile by tile in the kernel), in interpret
mode, against the reference: the pages gathered, dequantised (`kv_cache.decode`), dense
attention in f32 (`llamay.kernels.attention.paged_reference`). The in-kernel decoding
equals `kv_cache.decode` (itself gguf-py's) bit for bit; the kernels lower through
Triton (GPU) and Mosaic (TPU) with quantised pools. Cases are small: interpret mode
runs each grid step in Python."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from kernel_cases import encode, make_case
from test_pallas_lowering import KERNEL_CALL, S, lower

from llamay.kernels.attention import paged_reference
from llamay.kernels_pallas.paged_attention import (
    dequantize_tile,
    paged_attention_pallas,
    pool_types,
)
from llamay.kv.types import KV_TYPES
from llamay.quant import kv_cache

BLOCK = ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]


@pytest.mark.parametrize("name", BLOCK)
def test_tile_decoding_is_kv_cache_decode(name):
    """In-kernel decoding (int32 shifts and masks, f16 scales rebuilt from their bits,
    subnormal and negative ones included) equals kv_cache.decode bit for bit."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, 128)).astype(np.float32)
    x[:4] *= 1e-4  # scales in the f16 subnormal range
    x[4:8] = -np.abs(x[4:8])
    rows = encode(jnp.asarray(x), name)
    (t, _) = pool_types(rows, rows, 128)
    got = np.asarray(dequantize_tile(rows, t, 128))
    want = np.asarray(kv_cache.decode(rows, 128))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# (B, T, H, K, D, ps, M, window, softcap, K type, V type)
CASES = [
    (2, 1, 4, 2, 32, 4, 3, None, None, "q8_0", "q8_0"),  # decode, GQA 2:1
    (1, 1, 2, 1, 64, 8, 2, 5, 30.0, "q4_0", "q4_1"),  # MQA, window, softcap, 2 blocks
    (2, 3, 4, 2, 32, 4, 3, None, None, "q5_0", "f16"),  # a chunk of 3, float V
    (1, 1, 2, 2, 32, 4, 2, None, None, "f32", "q5_1"),  # float K, quantised V
]


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[9]}-{c[10]}-D{c[4]}T{c[1]}")
def test_kernel_equals_reference(case, platform):
    B, T, H, K, D, ps, M, window, cap, kt, vt = case
    q, k, v, table, pos = make_case(B, T, H, K, D, ps, M, kt, vt, seed=len(kt) + D + T)
    w = None if window is None else jnp.int32(window)
    kw = dict(scale=D**-0.5, window=w, softcap=cap)
    layer = jnp.int32(1)
    y = paged_attention_pallas(q, k, v, table, pos, layer, platform=platform, interpret=True, **kw)
    want = paged_reference(q, k, v, table, pos, layer, **kw)
    assert y.shape == (B, T, H, D)
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-5, atol=2e-6)


def test_pools_the_kernels_do_not_read_raise():
    k = jnp.zeros((2, 4, 4, 2, 60), jnp.uint8)  # 30 bytes a block of 32: no KV type
    with pytest.raises(ValueError):
        pool_types(k, k, 64)
    f = jnp.zeros((2, 4, 4, 2, 48), jnp.float16)
    with pytest.raises(ValueError):
        pool_types(f, f, 64)


@pytest.mark.parametrize("name", BLOCK)
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_quantised_kernel_lowers(platform, name):
    """Through Pallas' real front ends (Triton: power-of-two loads, no tile concatenation;
    Mosaic), SmolLM2's heads, K of the type, V f16."""
    T, H, K, D = 1, 9, 3, 64

    def fn(q, kp, vp, table, pos, layer):
        return paged_attention_pallas(q, kp, vp, table, pos, layer, scale=0.1, platform=platform)

    kpool = S((2, 100, 16, K, KV_TYPES[name].row_width(D)), jnp.uint8)
    vpool = S((2, 100, 16, K, D), jnp.float16)
    args = (S((8, T, H, D), jnp.float32), kpool, vpool, S((8, 12), jnp.int32))
    assert KERNEL_CALL[platform] in lower(platform, fn, *args, S((8, T), jnp.int32),
                                          S((), jnp.int32))  # fmt: skip
