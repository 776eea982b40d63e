"""Research ergonomics: running a model with a modified Architecture
(scripts/research_ablate_head.py) on the tiny llama."""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util

import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.arch import decoder
from llamay.gguf.constants import GGMLType
from llamay.quant import QTensor

IDS = [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]


@pytest.fixture(scope="module")
def script(request):
    path = request.config.rootpath / "scripts" / "research_ablate_head.py"
    spec = importlib.util.spec_from_file_location("research_ablate_head", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny():
    return llamay.load(tiny_model_file("llama"))


def test_unchanged_variant_gives_the_same_logits(tiny):
    same = tiny.with_architecture(
        dataclasses.replace(tiny.arch, block=functools.partial(decoder.block))
    )
    assert same.config.impl is not None and tiny.config.impl is None
    np.testing.assert_array_equal(same.logits(IDS), tiny.logits(IDS))


def test_head_ablation_equals_zeroing_its_output_columns(tiny, script):
    """Zeroing head 3 of layer 1 = zeroing those input columns of that layer's attn_output."""
    ablated = script.variant(tiny, attn=script.ablate_head(1, 3))
    d = tiny.config.head_dim
    wo = np.array(tiny.weights["layers"]["wo"].dequantize())  # [L, d_model, H·D]
    wo[1, :, 3 * d : 4 * d] = 0.0
    surgery = copy.copy(tiny)
    surgery.weights = copy.copy(tiny.weights)
    layers = dict(tiny.weights["layers"])
    layers["wo"] = QTensor(jnp.asarray(wo.view(np.uint8)), GGMLType.F32, wo.shape[-1])
    surgery.weights["layers"] = layers
    np.testing.assert_allclose(ablated.logits(IDS), surgery.logits(IDS), atol=1e-4)


def test_script_reports_where_the_change_starts(script):
    out = script.main([str(tiny_model_file("llama")), "--layer", "2", "--head", "1"])
    assert out["first_changed_layer"] == 2
    assert out["ablate_head"]["max_abs"] > 0 and out["swap_mlp"]["max_abs"] > 0
