"""`cpu_dot`: repacked weights hold the GGUF values bit for bit; the chunked CPU matmuls
equal float64 numpy over the dequantised weight; models bound repacked still match
their transformers goldens."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

import llamay
from llamay import kernels
from llamay.gguf.constants import GGMLType
from llamay.model import bind
from llamay.quant import LAYOUTS, AffineQTensor, MixedQTensor, QTensor, cpu_dot, dequantize
from llamay.sample import GREEDY

T = GGMLType
REPACKABLE = [t for t in LAYOUTS if cpu_dot.repackable(t)]


def random_blocks(t: GGMLType, rows: int, n_blocks: int, seed: int) -> np.ndarray:
    """Random bytes [rows, n_blocks * block_bytes] with finite scales of both signs over a
    wide range (f16 subnormals included)."""
    lay = LAYOUTS[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, n_blocks, lay.block_bytes), dtype=np.uint8)
    pos = 0
    for f in lay.fields:
        if f.dtype in ("float16", "float32"):
            mag = np.exp2(rng.uniform(-20, 4, (rows, n_blocks)))
            val = (mag * rng.choice([-1.0, 1.0], mag.shape)).astype(f.dtype)
            raw[..., pos : pos + f.nbytes] = val[..., None].view(np.uint8)
        pos += f.nbytes
    return raw.reshape(rows, -1)


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("t", REPACKABLE, ids=lambda t: t.name)
def test_repacked_values_equal_gguf_dequantisation(t):
    raw = random_blocks(t, 6, 3, seed=int(t))
    want = dequantize(raw, t)  # numpy, itself bit-equal to gguf-py
    w = AffineQTensor.from_raw(raw, t)
    assert w.shape == want.shape and w.cols == want.shape[-1]
    np.testing.assert_array_equal(bits(w.dequantize()), bits(want))
    ids = jnp.asarray([[4, 0], [5, 4]])
    np.testing.assert_array_equal(bits(w.rows(ids)), bits(want[np.asarray(ids)]))


def test_stacked_repack_slices_by_layer():
    raw = np.stack([random_blocks(T.Q4_K, 4, 2, seed=s) for s in range(3)])
    w = AffineQTensor.from_raw(raw, T.Q4_K)
    np.testing.assert_array_equal(
        bits(w.layer(jnp.int32(2)).dequantize()), bits(dequantize(raw[2], T.Q4_K))
    )


def test_repack_refuses_float_types_and_other_numerics():
    with pytest.raises(ValueError, match="F16"):
        cpu_dot.repack(np.zeros((2, 64), np.uint8), T.F16)
    q = jnp.zeros((2, 32), jnp.int8)
    with pytest.raises(ValueError, match="exact numerics only"):
        AffineQTensor(q, jnp.zeros((2, 1)), None, T.Q8_0, "llamacpp")


def oracle(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.astype(np.float64).T


@pytest.mark.parametrize("t", [T.Q4_1, T.Q6_K, T.Q8_0, T.F16], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [7, 3 * 64 + 5], ids=["one-chunk", "chunks+tail"])
def test_cpu_matmuls_equal_float64(t, rows, monkeypatch):
    """Chunked (a tail chunk included: 64 rows of 256 per chunk here) or not, repacked or
    GGUF blocks: x @ W.T within f32 accumulation error of float64 numpy."""
    monkeypatch.setattr(cpu_dot, "CHUNK_ELEMS", 64 * 256)
    monkeypatch.setenv(kernels.ENV, "reference")  # XLA's CPU forms, not native kernels
    raw = random_blocks(t, rows, 256 // LAYOUTS[t].block_elems, seed=rows)
    if t == T.F16:  # random f16 bits include inf/NaN: use real values
        raw = np.random.default_rng(0).standard_normal((rows, 256)).astype(np.float16)
        raw = raw.view(np.uint8)
    wf = dequantize(raw, t)
    x = np.random.default_rng(1).standard_normal((3, 2, 256)).astype(np.float32)
    want = oracle(x.reshape(-1, 256), wf).reshape(3, 2, rows)
    tol = 1e-5 * np.abs(x).sum(-1, keepdims=True).max() * np.abs(wf).max()
    candidates = [QTensor.from_raw(raw, t)]
    if cpu_dot.repackable(t):
        candidates.append(AffineQTensor.from_raw(raw, t))
    for w in candidates:
        got = np.asarray(kernels.matmul(jnp.asarray(x), w))
        np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=type(w).__name__)


def test_mixed_stacks_of_repacked_weights():
    a = np.stack([random_blocks(T.Q4_K, 8, 1, seed=s) for s in range(2)])
    b = random_blocks(T.Q6_K, 8, 1, seed=9)[None]
    w = MixedQTensor(
        (AffineQTensor.from_raw(a, T.Q4_K), AffineQTensor.from_raw(b, T.Q6_K)),
        jnp.int32(1),
        jnp.int32(0),
    )
    x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
    want = oracle(x, dequantize(b[0], T.Q6_K))
    got = np.asarray(kernels.matmul(jnp.asarray(x), w))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


# -- models bound repacked, against the transformers goldens ------------------------------


def repacked(path):
    m = llamay.load(path)
    m.weights = bind(m.gguf, m.arch, m.config.n_layers, "exact", repack=True)
    return m


def test_bind_repacks_every_quantised_matrix(smollm2_path):
    m = repacked(smollm2_path)
    layers = m.weights["layers"]
    assert isinstance(m.weights["tok_embd"], AffineQTensor)
    assert all(isinstance(layers[r], AffineQTensor) for r in ("wq", "w_up", "w_down"))
    assert layers["wq"].q.shape == (m.config.n_layers, 576, 576)
    with pytest.raises(ValueError, match="exact numerics only"):
        bind(m.gguf, m.arch, m.config.n_layers, "llamacpp", repack=True)


@pytest.mark.model
def test_repacked_smollm2_matches_transformers(smollm2_path, fixtures_dir):
    m = repacked(smollm2_path)
    gold = json.loads(
        (fixtures_dir / "transformers" / "smollm2-135m-instruct-q4_1.json").read_text()
    )
    for g in gold["greedy"][:3]:
        row = m.logits(g["prompt_ids"])[-1]
        np.testing.assert_allclose(
            row[g["first_top10_ids"]], g["first_top10_logits"], atol=1e-3, err_msg=g["prompt"]
        )
        n = min(8, len(g["greedy_ids"]))
        got = list(m.generation(g["prompt_ids"], max_tokens=n, sampler=GREEDY))
        assert got == g["greedy_ids"][: len(got)] and len(got) >= 1, g["prompt"]


@pytest.mark.model
def test_repacked_gemma3_matches_transformers(gemma3_path, fixtures_dir):
    """Q4_K_M mixes Q4_K/Q6_K and Q5_0/Q8_0 per layer: MixedQTensors of repacked stacks."""
    m = repacked(gemma3_path)
    assert isinstance(m.weights["layers"]["w_down"], MixedQTensor)
    gold = json.loads((fixtures_dir / "transformers" / "gemma-3-270m-q4_k_m.json").read_text())
    for g in gold["greedy"][:2]:
        ids = g["prompt_ids"] + g["greedy_ids"][:5]
        rows = m.logits(ids)[len(g["prompt_ids"]) - 1 :]
        assert rows.argmax(1).tolist() == g["greedy_ids"][:6], g["prompt"]
        np.testing.assert_allclose(
            rows[0][g["first_top10_ids"]], g["first_top10_logits"], atol=1e-3, err_msg=g["prompt"]
        )
