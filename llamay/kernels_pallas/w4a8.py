"""W4A8 (and W5/W6/W8-A8) matmul: activations quantised per 32-block to int8, an integer
dot per scale group with int32 accumulation, scaled in f32. Beside it, its references.

Activations (`quantize_acts`, Q8_0-style but with an f32 scale): per 32-block of x,
d = max|x| / 127 and q = round(x / d), so x̂ = q·d. The weight is the kernel layout
(`layout`): w = (q_w - zero)·s + o per element. Then

    y[m, n] = Σ_groups s·d·Σ_group q·(q_w - zero)  +  Σ_32-blocks o·Σ_block x

The integer sums are exact; the offset term uses the exact f32 block sums of x (not
of x̂), so only the scaled part sees the activation rounding.

Error bound against the exact product x @ W.T (`error_bound`): |x - x̂| ≤ d/2 per
element (round to nearest), hence

    |y - y_exact| ≤ Σ_e (d_e / 2)·|(q_w,e - zero)·s_e|  (+ f32 rounding of both sums)

The kernel equals `w4a8_reference` (x̂ against the dequantised weight, in f32) to f32
rounding, and the exact reference (`qmatmul_reference`) within that bound.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from llamay.kernels_pallas.layout import (
    F32,
    Format,
    PackedWeight,
    dequantize_tile,
    integer_tile,
)
from llamay.kernels_pallas.qmatmul import (
    HIGHEST,
    Tiling,
    as_rows,
    check_tiling,
    compiler_params,
    k_chunks,
    load_planes,
    plane_names,
    tiling_for,
    weight_specs,
)


def quantize_acts(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., K] -> (q int8 [..., K], d f32 [..., K/32]): per 32-block, d = max|x|/127."""
    b = x.astype(F32).reshape(*x.shape[:-1], -1, 32)
    d = jnp.max(jnp.abs(b), axis=-1, keepdims=True) / 127
    q = jnp.round(b / jnp.where(d == 0, 1, d))
    return q.astype(jnp.int8).reshape(x.shape), d[..., 0]


def dequantize_acts(q: jax.Array, d: jax.Array) -> jax.Array:
    b = q.astype(F32).reshape(*q.shape[:-1], -1, 32)
    return (b * d[..., None]).reshape(q.shape)


def w4a8_reference(x: jax.Array, w: PackedWeight) -> jax.Array:
    """x̂ [..., K] (the quantised activations, as f32) @ W.T with the offset term on the
    exact block sums, in f32: what the kernel computes, in another order."""
    K = w.cols
    q, d = quantize_acts(x)
    fmt = w.fmt
    ints = integer_tile(w.q, w.high, fmt).astype(F32)  # [K, N]
    scale = jnp.repeat(w.scale, fmt.group, axis=0)  # [K, N]
    y = jnp.einsum("...k,kn->...n", dequantize_acts(q, d), ints * scale, precision=HIGHEST)
    if w.offset is not None:
        sums = jnp.sum(x.astype(F32).reshape(*x.shape[:-1], K // 32, 32), axis=-1)
        y = y + jnp.einsum("...g,gn->...n", sums, w.offset, precision=HIGHEST)
    return y


def error_bound(x: jax.Array, w: PackedWeight) -> jax.Array:
    """The bound on |W4A8 - exact| derived in the module docstring: Σ (d/2)·|(q_w - zero)·s|,
    plus f32 rounding slack (1e-5 relative to Σ |x|·|w|). [..., N]."""
    fmt = w.fmt
    _, d = quantize_acts(x)
    half_d = jnp.repeat(d / 2, 32, axis=-1)  # [..., K]
    scaled = jnp.abs(integer_tile(w.q, w.high, fmt).astype(F32))
    scaled = scaled * jnp.abs(jnp.repeat(w.scale, fmt.group, axis=0))
    wf = jnp.abs(dequantize_tile(w.q, w.high, w.scale, w.offset, fmt))
    slack = 1e-5 * jnp.einsum("...k,kn->...n", jnp.abs(x.astype(F32)), wf, precision=HIGHEST)
    return jnp.einsum("...k,kn->...n", half_d, scaled, precision=HIGHEST) + slack + 1e-30


def _kernel(qa_ref, da_ref, xs_ref, *refs, fmt: Format, names: list[str], chunk: int):
    *w_refs, o_ref = refs
    planes = dict(zip(names, w_refs, strict=True))

    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros(o_ref.shape, F32)

    tm, tn = o_ref.shape
    G = fmt.group
    groups = chunk // G

    def body(c, acc):
        p = load_planes(planes, fmt, c, chunk)
        ints = integer_tile(p["q"], p["high"], fmt).astype(jnp.int8)  # [chunk, tn]
        qa = qa_ref[:, pl.ds(c * chunk, chunk)].reshape(tm, groups, G)
        isum = jax.lax.dot_general(  # [groups, tm, tn], exact
            qa,
            ints.reshape(groups, G, tn),
            (((2,), (1,)), ((1,), (0,))),
            preferred_element_type=jnp.int32,
        )
        da = da_ref[pl.ds(c * (chunk // 32), chunk // 32), :]  # [chunk/32, tm]
        da = jnp.broadcast_to(da[:, None, :], (chunk // 32, 32 // G, tm)).reshape(groups, tm, 1)
        s = p["scale"].reshape(groups, 1, tn)
        acc = acc + jnp.sum(isum.astype(F32) * (da * s), axis=0)
        if p["offset"] is not None:
            xs = xs_ref[pl.ds(c * (chunk // 32), chunk // 32), :]  # [chunk/32, tm]
            dims = (((0,), (0,)), ((), ()))
            acc = acc + jax.lax.dot_general(
                xs, p["offset"], dims, precision=HIGHEST, preferred_element_type=F32
            )
        return acc

    o_ref[...] += k_chunks(qa_ref.shape[1], chunk, body, jnp.zeros(o_ref.shape, F32))


@functools.partial(jax.jit, static_argnames=("platform", "interpret", "tiling"))
def w4a8_pallas(
    x: jax.Array,
    w: PackedWeight,
    *,
    platform: str = "tpu",
    interpret=False,
    tiling: Tiling | None = None,
) -> jax.Array:
    """x [..., K] @ W.T -> [..., N] f32 with int8 activations (module docstring). TPU only:
    a batched integer dot per scale group, which Pallas' Triton lowering does not have."""
    if platform != "tpu":
        raise ValueError("w4a8_pallas is a TPU kernel (Triton has no batched integer dot)")
    if tiling is not None and tiling.split_k:
        raise ValueError("w4a8_pallas accumulates over K on chip: no split-K tiling")
    N, K = w.n_rows, w.cols
    x2, lead = as_rows(x, w, "w4a8")
    M = x2.shape[0]
    qa, da = quantize_acts(x2)
    xs = jnp.sum(x2.reshape(M, K // 32, 32), axis=-1)
    # per-block scales and sums transposed [K/32, M]: M on the lanes, as TPU blocks want
    da, xs = da.T, xs.T
    t = tiling or tiling_for(M, N, K, platform)
    check_tiling(t, K)
    arrays, specs = weight_specs(w, t)
    act_specs = [
        pl.BlockSpec((t.tm, t.tk), lambda i, j, k: (i, k)),
        pl.BlockSpec((t.tk // 32, t.tm), lambda i, j, k: (k, i)),
        pl.BlockSpec((t.tk // 32, t.tm), lambda i, j, k: (k, i)),
    ]
    kernel = functools.partial(_kernel, fmt=w.fmt, names=plane_names(w), chunk=t.chunk)
    y = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((M, N), F32),
        grid=(pl.cdiv(M, t.tm), pl.cdiv(N, t.tn), K // t.tk),
        in_specs=[*act_specs, *specs],
        out_specs=pl.BlockSpec((t.tm, t.tn), lambda i, j, k: (i, j)),
        compiler_params=compiler_params(platform, interpret),
        interpret=interpret,
        name=f"w4a8_{w.ggml_type.name.lower()}",
    )(qa, da, xs, *arrays)
    return y.reshape(*lead, N)
