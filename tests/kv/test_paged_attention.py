"""The paged-attention reference against dense attention, and paged writes."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from llamay import kernels
from llamay.arch.paged import PagedLayer, attention, paged_write, write_kv
from llamay.kernels_pallas.paged_attention import gather_pages


def test_paged_equals_dense_over_scattered_pages():
    rng = np.random.default_rng(0)
    B, T, H, K, D, ps, P = 2, 3, 4, 2, 8, 4, 12
    lens = [7, 10]
    table = np.zeros((B, 4), np.int32)
    table[0, :2] = [5, 2]
    table[1, :3] = [9, 1, 7]
    k_pages = np.zeros((P, ps, K, D), np.float32)
    v_pages = np.zeros((P, ps, K, D), np.float32)
    S = 16
    k_dense = np.zeros((B, S, K, D), np.float32)
    v_dense = np.zeros((B, S, K, D), np.float32)
    for b, n in enumerate(lens):
        kk, vv = rng.normal(size=(2, n, K, D)).astype(np.float32)
        k_dense[b, :n], v_dense[b, :n] = kk, vv
        for pos in range(n):
            k_pages[table[b, pos // ps], pos % ps] = kk[pos]
            v_pages[table[b, pos // ps], pos % ps] = vv[pos]
    q = jnp.asarray(rng.normal(size=(B, T, H, D)).astype(np.float32))
    q_pos = jnp.asarray([[4, 5, 6], [7, 8, 9]], jnp.int32)
    kw = dict(scale=0.3, window=jnp.asarray(5), softcap=None)
    dense = kernels.attention(q, jnp.asarray(k_dense), jnp.asarray(v_dense), q_pos, **kw)
    t = jnp.asarray(table)
    paged = attention(
        q, PagedLayer(jnp.asarray(k_pages), t), PagedLayer(jnp.asarray(v_pages), t), q_pos, **kw
    )
    np.testing.assert_allclose(np.asarray(paged), np.asarray(dense), rtol=1e-6, atol=1e-6)
    assert PagedLayer(jnp.asarray(k_pages), t).shape == (B, 16, K, D)


def test_paged_write_goes_through_the_table_and_drops_padding():
    P, ps, K, D = 6, 4, 1, 2
    pages = jnp.zeros((P, ps, K, D))
    table = jnp.asarray([[3, 5]], jnp.int32)
    new = jnp.arange(1, 4, dtype=jnp.float32).reshape(1, 3, 1, 1) * jnp.ones((1, 3, K, D))
    out = paged_write(pages, table, new, jnp.asarray([[3, 4, 1 << 30]], jnp.int32))
    out = np.asarray(out)
    assert out[3, 3, 0, 0] == 1 and out[5, 0, 0, 0] == 2
    assert np.count_nonzero(out) == 2 * D  # the padding row wrote nothing
    view = gather_pages(jnp.asarray(out), table)
    assert view.shape == (1, 8, K, D) and float(view[0, 4, 0, 0]) == 2
    dense = jnp.zeros((1, 8, K, D))
    assert write_kv(dense, new, jnp.asarray([[0, 1, 8]])).shape == dense.shape  # dense path
