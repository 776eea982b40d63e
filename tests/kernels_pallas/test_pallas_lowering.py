"""The kernels the dispatcher sends to hardware lower through Pallas' real backends without
the hardware: Triton and Mosaic GPU (an abstract H200) and Mosaic (TPU, an abstract v5e).
This runs the front ends that reject unsupported ops and block shapes (e.g. Triton's
concatenate only along the last dim, Mosaic's (8, 128) block tiling, Mosaic GPU's register
layouts and TMA copies); the device compilers after them (ptxas, libtpu) still need the
hardware (bench/pallas_gpu.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractDevice, AbstractMesh
from test_pallas_qmatmul import TYPES, random_weight

from llamay.gguf.constants import GGMLType
from llamay.kernels_pallas import repack
from llamay.kernels_pallas.paged_attention import paged_attention_pallas
from llamay.kernels_pallas.qmatmul import qmatmul_pallas
from llamay.kernels_pallas.qmatmul_mosaic import qmatmul_mosaic
from llamay.kernels_pallas.w4a8 import w4a8_pallas

DEVICES = {
    "gpu": ("cuda", AbstractDevice("NVIDIA H200", None, "cuda")),
    "tpu": ("tpu", AbstractDevice("TPU v5 lite", 1, "tpu")),
}
S = jax.ShapeDtypeStruct


def lower(platform: str, fn, *args) -> str:
    target, device = DEVICES[platform]
    with jax.sharding.use_abstract_mesh(AbstractMesh((1,), ("x",), abstract_device=device)):
        return jax.jit(fn).trace(*args).lower(lowering_platforms=(target,)).as_text()


KERNEL_CALL = {"gpu": "xla.gpu.triton", "tpu": "tpu_custom_call", "mosaic-gpu": "mosaic_gpu"}


@pytest.mark.parametrize("m", [1, 256], ids=["decode", "prefill"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_qmatmul_lowers(platform, t, m):
    w = repack(random_weight(t, 512, 2048))
    text = lower(platform, lambda x, w: qmatmul_pallas(x, w, platform=platform),
                 S((m, 2048), jnp.float32), w)  # fmt: skip
    assert KERNEL_CALL[platform] in text


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=lambda t: t.name)
def test_w4a8_lowers_for_tpu(t):
    w = repack(random_weight(t, 512, 2048))
    text = lower(
        "tpu", lambda x, w: w4a8_pallas(x, w, platform="tpu"), S((8, 2048), jnp.float32), w
    )
    assert KERNEL_CALL["tpu"] in text


# (T, H, K, D, window, softcap): SmolLM2's 9:3 heads, Gemma 3's MQA D=256 with window and
# softcap, a short prefill chunk.
PAGED = [(1, 9, 3, 64, None, None), (1, 4, 1, 256, 512, 50.0), (4, 8, 2, 128, None, None)]


@pytest.mark.parametrize("case", PAGED, ids=lambda c: f"T{c[0]}H{c[1]}K{c[2]}D{c[3]}w{c[4]}")
@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_paged_attention_lowers(platform, case):
    T, H, K, D, window, cap = case

    def fn(q, kp, vp, table, pos, layer):
        return paged_attention_pallas(q, kp, vp, table, pos, layer, scale=0.1, window=window,
                                      softcap=cap, platform=platform)  # fmt: skip

    pool = S((2, 100, 16, K, D), jnp.float32)
    args = (S((8, T, H, D), jnp.float32), pool, pool, S((8, 12), jnp.int32), S((8, T), jnp.int32))
    assert KERNEL_CALL[platform] in lower(platform, fn, *args, S((), jnp.int32))


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_vmapped_expert_matmul_lowers(platform):
    """MoE experts: the kernel under vmap (one weight per expert), as `expert_matmul` maps it."""
    w = repack(random_weight(GGMLType.Q4_K, 4 * 256, 512))
    experts = jax.tree_util.tree_map(lambda a: a.reshape(a.shape[0], 4, -1).swapaxes(0, 1), w)

    def fn(x, e):
        return jax.vmap(lambda x, e: qmatmul_pallas(x, e, platform=platform))(x, e)

    assert KERNEL_CALL[platform] in lower(platform, fn, S((4, 1, 512), jnp.float32), experts)


@pytest.mark.parametrize("m", [1, 8], ids=["M1", "M8"])
@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_mosaic_qmatmul_lowers(t, m):
    """The Mosaic GPU decode kernel, on SmolLM2's 576 output columns (an edge tile)."""
    w = repack(random_weight(t, 576, 2048))
    text = lower("gpu", qmatmul_mosaic, S((m, 2048), jnp.float32), w)
    assert KERNEL_CALL["mosaic-gpu"] in text and KERNEL_CALL["gpu"] not in text


def test_vmapped_expert_mosaic_matmul_lowers():
    w = repack(random_weight(GGMLType.Q4_K, 4 * 256, 512))
    experts = jax.tree_util.tree_map(lambda a: a.reshape(a.shape[0], 4, -1).swapaxes(0, 1), w)
    text = lower("gpu", jax.vmap(qmatmul_mosaic), S((4, 1, 512), jnp.float32), experts)
    assert KERNEL_CALL["mosaic-gpu"] in text
