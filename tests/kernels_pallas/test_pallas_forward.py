"""The paged forward pass of tiny fixture models with the Pallas dispatch forced in
interpret mode (`LLAMAY_BACKEND=pallas-interpret`: quantised matmuls, MoE experts and
paged attention through the kernels) gives the reference dispatch's logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fixture_data import tiny_model_file
from test_pallas_qmatmul import random_weight, random_x

import llamay
from llamay import kernels
from llamay.arch import architecture_of
from llamay.gguf.constants import GGMLType
from llamay.kernels import repack_weights
from llamay.kv.pages import new_paged_kv
from llamay.model.bind import bind
from llamay.model.forward import forward
from llamay.quant import AffineQTensor, QTensor, qmatmul

PAGE = 4


def paged_logits(model, tokens: np.ndarray, monkeypatch, choice: str, prepack: bool = False):
    """Prefill `tokens` [B, T] (row b's page table: pages 1+b·M ..), then decode one more
    token per row: logits of both steps, [B, T + 1, V], and the prefill step's jaxpr.
    Traced afresh under `choice`; `prepack`: weights repacked beforehand (`repack_weights`)."""
    monkeypatch.setenv(kernels.ENV, choice)
    cfg = model.config
    # GGUF-block QTensors (the layout GPU/TPU binds; on one CPU device `bind` repacks)
    w = bind(model.gguf, model.arch, cfg.n_layers, cfg.numerics, repack=False)
    if prepack:
        w = repack_weights(w)
    B, T = tokens.shape
    M = (T + 1 + PAGE - 1) // PAGE + 1  # one page more than needed: the null page's reads
    kv = new_paged_kv(cfg.n_layers, 1 + B * M, PAGE, cfg.n_kv_heads, cfg.head_dim)
    table = jnp.asarray(1 + np.arange(B * M).reshape(B, M), jnp.int32)
    arch = architecture_of(cfg)

    def step(kv, toks, pos):
        x, kv, _ = forward(cfg, w, kv, toks, pos, page_table=table)
        return arch.head(cfg, w, x), kv

    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    jaxpr = str(jax.make_jaxpr(step)(kv, jnp.asarray(tokens), pos))
    step = jax.jit(step)  # a new jit: traced with this choice of backend
    first, kv = step(kv, jnp.asarray(tokens), pos)
    nxt = jnp.argmax(first[:, -1], axis=-1)[:, None].astype(jnp.int32)
    second, _ = step(kv, nxt, jnp.full((B, 1), T, jnp.int32))
    return np.asarray(jnp.concatenate([first, second], axis=1)), jaxpr


# gemma3: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 and sliding-window layers (window 8 < 11 positions),
# weights repacked once beforehand (the tied head too); qwen3moe: Q4_K/Q5_K/Q6_K experts
# (vmapped kernels) repacked inside the trace, F16 attention (the reference matmul).
KERNELS = {
    "gemma3": ["qmatmul_q4_0", "qmatmul_q5_1", "qmatmul_q8_0", "paged_attention_tpu"],
    "qwen3moe": ["qmatmul_q4_k", "qmatmul_q5_k", "qmatmul_q6_k", "paged_attention_tpu"],
}


@pytest.mark.parametrize("family", list(KERNELS))
def test_pallas_dispatch_forward_equals_reference(family, monkeypatch):
    model = llamay.load(tiny_model_file(family))
    tokens = np.random.default_rng(0).integers(3, 1000, (2, 10)).astype(np.int32)
    ref, ref_jaxpr = paged_logits(model, tokens, monkeypatch, "reference")
    got, jaxpr = paged_logits(model, tokens, monkeypatch, "pallas-interpret", family == "gemma3")
    assert "pallas_call" not in ref_jaxpr
    for kernel in KERNELS[family]:  # the kernels really ran
        assert kernel in jaxpr, kernel
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=2e-5 * scale, rtol=0)


@pytest.mark.slow  # GPU interpret mode simulates every CTA: about a minute
def test_mosaic_gpu_dispatch_forward_equals_reference(monkeypatch):
    """`pallas-interpret-mosaic-gpu`: a decode-sized prefill (6 rows) and a decode step of
    tiny qwen3 (Q4_K/Q5_K/Q6_K matrices) through the Mosaic GPU matmul in GPU interpret
    mode, attention through the Triton-variant kernel; Q2_K/Q3_K take `qmatmul`."""
    model = llamay.load(tiny_model_file("qwen3"))
    tokens = np.random.default_rng(1).integers(3, 1000, (1, 6)).astype(np.int32)
    ref, _ = paged_logits(model, tokens, monkeypatch, "reference")
    got, jaxpr = paged_logits(model, tokens, monkeypatch, "pallas-interpret-mosaic-gpu", True)
    for kernel in ["qmatmul_mosaic_q4_k", "qmatmul_mosaic_q5_k", "qmatmul_mosaic_q6_k"]:
        assert kernel in jaxpr, kernel
    assert "qmatmul_q4_k" not in jaxpr  # no Triton matmul for decode rows
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=2e-5 * scale, rtol=0)


def test_backend_choice(monkeypatch):
    monkeypatch.setenv(kernels.ENV, "reference")
    assert not kernels.backend().pallas
    monkeypatch.setenv(kernels.ENV, "pallas-interpret-gpu")
    assert kernels.backend() == kernels.Backend(True, "gpu", interpret=True)
    monkeypatch.delenv(kernels.ENV)
    assert kernels.backend().pallas == (jax.default_backend() in ("gpu", "tpu"))
    monkeypatch.setenv(kernels.ENV, "triton")
    with pytest.raises(ValueError, match="LLAMAY_BACKEND='triton'"):
        kernels.backend()


def test_weights_without_a_kernel_take_qmatmul(monkeypatch):
    """Under a forced Pallas dispatch: the CPU layout (AffineQTensor), llama.cpp numerics
    and types without a kernel still go to `qmatmul` (the same numbers, no pallas_call);
    a GGUF-block QTensor of a kernel type does take the kernel."""
    monkeypatch.setenv(kernels.ENV, "pallas-interpret")
    raw = np.asarray(random_weight(GGMLType.Q4_0, 16, 256).data)
    x = random_x(2, 256)
    others = [
        AffineQTensor.from_raw(raw, GGMLType.Q4_0),
        QTensor.from_raw(raw, GGMLType.Q4_0, "llamacpp"),
        random_weight(GGMLType.Q3_K, 16, 256),
    ]
    for w in others:
        assert "pallas_call" not in str(jax.make_jaxpr(kernels.matmul)(x, w))
        np.testing.assert_array_equal(kernels.matmul(x, w), qmatmul(x, w))
    assert "pallas_call" in str(
        jax.make_jaxpr(kernels.matmul)(x, QTensor.from_raw(raw, GGMLType.Q4_0))
    )
