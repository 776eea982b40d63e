"""Which weight layout `bind` gives per backend, and that a mesh places every layout.

CPU, exact numerics: `AffineQTensor` (llamay.quant.cpu_dot) whatever the device count.
Pallas kernels forced (LLAMAY_BACKEND=pallas-interpret, as on GPU/TPU): the kernel
layout (`kernels.repack_weights`) once at load, equal to repacking the
GGUF-block QTensors by hand.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay import kernels
from llamay.kernels import repack_weights
from llamay.kernels_pallas import PackedWeight
from llamay.model.bind import bind, default_repack
from llamay.model.sharding import make_mesh, shard_weights
from llamay.quant import AffineQTensor, QTensor


@pytest.fixture(scope="module")
def gemma3():
    # Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 matrices, a tied head
    return llamay.load(tiny_model_file("gemma3"))


def test_cpu_exact_repacks_whatever_the_device_count(gemma3, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "reference")
    assert default_repack("exact") and not default_repack("llamacpp")
    layers = bind(gemma3.gguf, gemma3.arch, gemma3.config.n_layers).get("layers")
    assert isinstance(layers["wq"], AffineQTensor)


def test_pallas_backend_binds_the_kernel_layout_once(gemma3, monkeypatch):
    monkeypatch.setenv(kernels.ENV, "pallas-interpret")
    assert not default_repack("exact")
    cfg = gemma3.config
    got = bind(gemma3.gguf, gemma3.arch, cfg.n_layers)
    assert isinstance(got["layers"]["wq"], PackedWeight)
    assert isinstance(got["output"], PackedWeight)  # the tied head, repacked
    assert isinstance(got["tok_embd"], QTensor)  # the embedding lookup reads blocks
    # repack=False: the GGUF blocks as they are, which repacked by hand give the same
    blocks = bind(gemma3.gguf, gemma3.arch, cfg.n_layers, repack=False)
    assert isinstance(blocks["layers"]["wq"], QTensor)
    want = repack_weights(blocks)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # llama.cpp numerics never take the kernels: the GGUF blocks stay
    ggml = bind(gemma3.gguf, gemma3.arch, cfg.n_layers, "llamacpp")
    assert isinstance(ggml["layers"]["wq"], QTensor)


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (make test's XLA_FLAGS)")
@pytest.mark.parametrize("choice", ["reference", "pallas-interpret"])
def test_mesh_places_every_layout(gemma3, monkeypatch, choice):
    """Every array of every layout lands on the mesh with the unsharded values."""
    monkeypatch.setenv(kernels.ENV, choice)
    w = bind(gemma3.gguf, gemma3.arch, gemma3.config.n_layers)
    placed = shard_weights(gemma3.config, w, make_mesh("dp=2,tp=2"))
    for a, b in zip(jax.tree.leaves(placed), jax.tree.leaves(w), strict=True):
        assert len(a.sharding.device_set) == 4
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    down = placed["layers"]["w_down"]
    # w_down splits its input columns: axis -1 of the CPU form, -2 of the kernel form
    spec = (down.q if choice == "reference" else down.scale).sharding.spec
    assert "model" in tuple(spec)
