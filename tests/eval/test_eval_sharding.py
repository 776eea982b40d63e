"""Sharded (dp=2,tp=2 and tp=4) logits and scores equal the unsharded ones (4 CPU devices)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_model_file
from jax.sharding import PartitionSpec as P

from llamay.errors import RequestError
from llamay.model.score import batch_logits
from llamay.model.sharding import make_mesh, parse_mesh, put_batch, sharded_model, weight_specs
from llamay.quant import AffineQTensor, MixedQTensor

MESHES = ["dp=2,tp=2", "tp=4"]
CONTEXTS = ["The capital of France is", "Once upon a time", "", "A B C "]
CONTINUATIONS = [" Paris", " there was a princess", "Hello world", "D"]

needs_4 = pytest.mark.skipif(
    len(jax.devices()) < 4,
    reason="needs 4 devices: XLA_FLAGS=--xla_force_host_platform_device_count=4 (as `make test`)",
)


def batch(seed: int = 0, B: int = 4, T: int = 32):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 1000, (B, T)).astype(np.int32)
    positions = np.tile(np.arange(T, dtype=np.int32), (B, 1))
    positions[1, 20:] = T  # a padded row
    return tokens, positions


def placed(w):
    """Where a bound matrix's quants live: GGUF blocks (a one-stack MixedQTensor where the
    native CPU kernels run), or the CPU repacked form."""
    if isinstance(w, MixedQTensor):
        (w,) = w.stacks
    return (w.q if isinstance(w, AffineQTensor) else w.data).sharding.spec


def check_equal(m, mesh_spec, atol):
    tokens, positions = batch()
    ref = np.asarray(batch_logits(m.config, m.weights, jnp.asarray(tokens), jnp.asarray(positions)))
    mesh = make_mesh(mesh_spec)
    sm = sharded_model(m, mesh)
    out = batch_logits(
        m.config, sm.weights, put_batch(tokens, mesh), put_batch(positions, mesh), mesh=mesh
    )
    real = positions < tokens.shape[1]
    np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=atol, rtol=0)
    want = m.score(CONTEXTS, CONTINUATIONS, batch=4)
    got = sm.score(CONTEXTS, CONTINUATIONS, batch=4)
    np.testing.assert_allclose([g[0] for g in got], [w[0] for w in want], atol=atol, rtol=1e-5)
    assert [g[1] for g in got] == [w[1] for w in want]
    return sm


@needs_4
@pytest.mark.parametrize("mesh_spec", MESHES)
def test_tiny_sharded_equals_unsharded(tiny_llama_model, mesh_spec):
    sm = check_equal(tiny_llama_model, mesh_spec, atol=1e-4)
    # tiny llama: 4 heads / 2 kv heads, so tp=2 splits attention and tp=4 does not
    assert placed(sm.weights["layers"]["wq"]) == P(
        None, "model" if "tp=2" in mesh_spec else None, None
    )


@needs_4
@pytest.mark.model
@pytest.mark.parametrize("mesh_spec", MESHES)
def test_smollm2_sharded_equals_unsharded(smollm2_model, mesh_spec):
    sm = check_equal(smollm2_model, mesh_spec, atol=2e-3)
    layers = sm.weights["layers"]
    # 9 heads / 3 kv heads: attention replicated; the FFN splits (rows, then whole blocks)
    assert placed(layers["w_up"]) == P(None, "model", None)
    assert placed(layers["w_down"]) == P(None, None, "model")
    assert placed(layers["wq"]) == P(None, None, None)
    if isinstance(layers["w_down"], AffineQTensor):  # the XLA CPU form: scales split with it
        assert layers["w_down"].scale.sharding.spec == P(None, None, "model")


@needs_4
def test_rules_shard_quantised_columns_in_whole_blocks(smollm2_path):
    import llamay
    from llamay.model.bind import bind

    m = llamay.load(smollm2_path)
    for repack in (False, True):
        w = bind(m.gguf, m.arch, m.config.n_layers, "exact", repack=repack)
        specs = weight_specs(m.config, w, make_mesh("tp=4"))
        down, embd = specs["layers"]["w_down"], specs["tok_embd"]
        # w_down: Q4_1, 1536 columns = 48 blocks (or scale groups) -> 12 per device
        for spec in (down.q, down.scale, down.offset) if repack else (down.data,):
            assert spec == P(None, None, "model")
        assert (embd.q if repack else embd.data) == P("model", None)
    assert specs["layers"]["attn_norm"] == P(None, None)


def test_parse_mesh():
    assert parse_mesh("dp=2,tp=2") == {"data": 2, "model": 2}
    assert parse_mesh("tp=4") == {"data": 1, "model": 4}
    assert parse_mesh(None) == {"data": 1, "model": 1}
    for bad in ("dp=0", "pp=2", "tp=x"):
        with pytest.raises(RequestError, match="mesh"):
            parse_mesh(bad)
    with pytest.raises(RequestError, match="devices"):
        make_mesh({"data": 64, "model": 64})


@needs_4
@pytest.mark.parametrize("arch", ["gemma3", "qwen3moe", "phi3"])
def test_other_tiny_families_sharded(arch):
    """Sliding windows and softcaps (gemma3), stacked experts (qwen3moe), fused qkv (phi3)."""
    import llamay

    m = llamay.load(tiny_model_file(arch))
    check_equal(m, "dp=2,tp=2", atol=1e-4)
