"""Quantised matmul y = x @ W.T: the Pallas kernel over the kernel layout (`layout`), and
its jnp reference.

Reference (`qmatmul_reference`): dequantise the QTensor with llamay.quant and dot in f32
(llamay.quant.qmatmul's exact numerics). The kernel dequantises each [k, n] weight tile
in VMEM/registers (`layout.dequantize_tile`: the same exact values) and accumulates
x_tile @ w_tile in f32, so it equals the reference up to f32 summation order.

Grid (M/tm, N/tn, K/tk); inside a block the kernel walks its K range in `chunk`-row
steps. Two tilings per platform (`tiling_for`):

- TPU (Mosaic): the output block stays resident across the K axis, which accumulates
  ("arbitrary"); one chunk per step, so Mosaic double-buffers the weight planes;
  decode tm = 8 (one sublane tile), prefill tm = 256.
- GPU (Pallas' Triton lowering: every grid point runs in parallel, so nothing may
  accumulate across the grid): split-K, each K range writes its own partial sums
  [K/tk, M, N], added up after the kernel; tk is chosen so that the grid has enough
  programs to fill the GPU (`GPU_PROGRAMS`) even for a single row; tm >= 16 (the
  smallest tl.dot).

A single row (M = 1, batch-1 decode) is a matvec on both: tm = 1 and a multiply-reduce
instead of a dot (a dot would pad the row to 8 or 16 and, in f32, be compute-bound).

Both are the same kernel body; the tests run both tilings in interpret mode.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from llamay.kernels_pallas.layout import F32, Format, PackedWeight, dequantize_tile
from llamay.quant import QTensor

HIGHEST = jax.lax.Precision.HIGHEST
PLATFORMS = ("tpu", "gpu")


def qmatmul_reference(x: jax.Array, w: QTensor) -> jax.Array:
    """x [..., K] @ W.T in f32 over the weight dequantised by llamay.quant."""
    return jnp.einsum("...k,nk->...n", x.astype(F32), w.dequantize(F32), precision=HIGHEST)


@dataclass(frozen=True)
class Tiling:
    tm: int  # rows of x per block
    tn: int  # weight rows (outputs) per block
    tk: int  # K per grid step (0 in TILINGS: chosen for parallelism, GPU)
    chunk: int  # K rows dequantised at once inside a block
    split_k: bool = False  # K ranges write partial sums instead of accumulating


# (platform, prefill?) -> tiling targets; `tiling_for` fits them to the shapes.
TILINGS = {
    ("tpu", False): Tiling(tm=8, tn=512, tk=1024, chunk=1024),
    ("tpu", True): Tiling(tm=256, tn=256, tk=512, chunk=512),
    ("gpu", False): Tiling(tm=16, tn=64, tk=0, chunk=256, split_k=True),
    ("gpu", True): Tiling(tm=64, tn=128, tk=0, chunk=64, split_k=True),
}
GPU_PROGRAMS = 4 * 132  # split-K target: a few programs per H100/H200 SM
DECODE_MAX_ROWS = 8  # M <= this: the decode (matvec) tiling


def _divisor(total: int, target: int, step: int) -> int:
    """The largest multiple of `step` dividing `total` and <= target, else `total`."""
    for t in range(min(target, total) // step * step, 0, -step):
        if total % t == 0:
            return t
    return total


def _fit(dim: int, tile: int, platform: str, minimum: int) -> int:
    """A block size for a dim: the tile, or the dim itself when smaller (rounded up to
    a power of two >= minimum on GPU, whose blocks must be powers of two)."""
    if dim >= tile:
        return tile
    if platform == "gpu":
        return max(minimum, pl.next_power_of_2(dim))
    return dim


def tiling_for(M: int, N: int, K: int, platform: str) -> Tiling:
    """The decode or prefill tiling for x [M, K] @ W[N, K].T, fitted to the shapes."""
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, not {platform!r}")
    t = TILINGS[platform, M > DECODE_MAX_ROWS]
    tm = 1 if M == 1 else _fit(M, t.tm, platform, 16)  # M = 1: the matvec
    tn = _fit(N, t.tn, platform, 16)
    if t.tk == 0:  # split K until the grid has about GPU_PROGRAMS programs
        blocks = pl.cdiv(M, tm) * pl.cdiv(N, tn)
        tk = _divisor(K, max(256, K * blocks // GPU_PROGRAMS), 256)
    else:
        tk = _divisor(K, t.tk, 256)
    chunk = _divisor(tk, t.chunk, 32)
    return Tiling(tm, tn, tk, chunk, t.split_k)


def check_tiling(t: Tiling, K: int) -> None:
    if t.tk <= 0 or K % t.tk or t.tk % t.chunk or t.chunk % 32:
        raise ValueError(
            f"tiling {t} does not fit K={K}: tk must divide K, chunk divide tk, and "
            "chunk be a multiple of 32"
        )


def weight_specs(w: PackedWeight, t: Tiling) -> tuple[list, list]:
    """The weight planes present and their BlockSpecs (block (k, j) of the grid)."""
    fmt = w.fmt
    q_rows = t.tk if fmt.bits == 8 else t.tk // 2
    planes = [(w.q, q_rows), (w.high, t.tk // 32 * fmt.high_bits)]
    planes += [(w.scale, t.tk // fmt.group), (w.offset, t.tk // 32)]
    arrays, specs = [], []
    for a, rows in planes:
        if a is not None:
            arrays.append(a)
            specs.append(pl.BlockSpec((rows, t.tn), lambda i, j, k: (k, j)))
    return arrays, specs


def chunk_rows(fmt: Format, c, chunk: int) -> dict[str, tuple]:
    """Per plane: (first row, row count) of K-chunk c (c may be traced)."""
    q = chunk if fmt.bits == 8 else chunk // 2
    return {
        "q": (c * q, q),
        "high": (c * (chunk // 32) * fmt.high_bits, (chunk // 32) * fmt.high_bits),
        "scale": (c * (chunk // fmt.group), chunk // fmt.group),
        "offset": (c * (chunk // 32), chunk // 32),
    }


def load_planes(refs: dict, fmt: Format, c, chunk: int) -> dict[str, jax.Array | None]:
    """The weight planes' rows of K-chunk c, loaded from their refs (absent: None)."""
    out = {}
    for name, (start, size) in chunk_rows(fmt, c, chunk).items():
        ref = refs.get(name)
        out[name] = None if ref is None else ref[pl.ds(start, size), :]
    return out


def as_rows(x: jax.Array, w: PackedWeight, name: str = "qmatmul") -> tuple[jax.Array, tuple]:
    """x [..., K] as f32 rows [M, K] and its leading dims, checked against a 2-D weight."""
    if x.shape[-1] != w.cols or w.q.ndim != 2:
        raise ValueError(f"{name}: x {x.shape} does not match a 2-D weight of shape {w.shape}")
    return x.reshape(-1, w.cols).astype(F32), x.shape[:-1]


def plane_names(w: PackedWeight) -> list[str]:
    names = ["q", "high", "scale", "offset"]
    return [n for n in names if getattr(w, n) is not None]


def k_chunks(tk: int, chunk: int, body, init):
    """body(c, acc) over the K-chunks of a block (a Python loop when there is one)."""
    n = tk // chunk
    if n == 1:
        return body(0, init)
    return jax.lax.fori_loop(0, n, body, init)


def _kernel(x_ref, *refs, fmt: Format, names: list[str], chunk: int, split_k: bool):
    *w_refs, o_ref = refs
    planes = dict(zip(names, w_refs, strict=True))

    def body(c, acc):
        p = load_planes(planes, fmt, c, chunk)
        w = dequantize_tile(p["q"], p["high"], p["scale"], p["offset"], fmt)  # [chunk, tn]
        xc = x_ref[:, pl.ds(c * chunk, chunk)].astype(F32)
        if xc.shape[0] == 1:  # matvec: one multiply-add per weight, no padded dot rows
            return acc + jnp.sum(xc.reshape(chunk, 1) * w, axis=0, keepdims=True)
        return acc + jnp.dot(xc, w, precision=HIGHEST, preferred_element_type=F32)

    acc = k_chunks(x_ref.shape[1], chunk, body, jnp.zeros(o_ref.shape, F32))
    if split_k:  # this K range's partial sums
        o_ref[...] = acc
        return

    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros(o_ref.shape, F32)

    o_ref[...] += acc


def compiler_params(platform: str, interpret) -> object | None:
    """TPU: the K axis accumulates ("arbitrary"); GPU: the Triton defaults."""
    if platform == "tpu" and not interpret:
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"))
    return None


@functools.partial(jax.jit, static_argnames=("platform", "interpret", "tiling"))
def qmatmul_pallas(
    x: jax.Array,
    w: PackedWeight,
    *,
    platform: str = "tpu",
    interpret=False,
    tiling: Tiling | None = None,
) -> jax.Array:
    """x [..., K] @ W.T -> [..., N] f32 with the Pallas kernel (W 2-D, kernel layout).
    `interpret`: False on hardware, True (or interpreter params) to run on CPU."""
    N, K = w.n_rows, w.cols
    x2, lead = as_rows(x, w)
    M = x2.shape[0]
    t = tiling or tiling_for(M, N, K, platform)
    check_tiling(t, K)
    arrays, specs = weight_specs(w, t)
    grid = (pl.cdiv(M, t.tm), pl.cdiv(N, t.tn), K // t.tk)
    kernel = functools.partial(
        _kernel, fmt=w.fmt, names=plane_names(w), chunk=t.chunk, split_k=t.split_k
    )
    if t.split_k:
        out_shape = jax.ShapeDtypeStruct((grid[2], M, N), F32)
        out_spec = pl.BlockSpec((None, t.tm, t.tn), lambda i, j, k: (k, i, j))
    else:
        out_shape = jax.ShapeDtypeStruct((M, N), F32)
        out_spec = pl.BlockSpec((t.tm, t.tn), lambda i, j, k: (i, j))
    y = pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=grid,
        in_specs=[pl.BlockSpec((t.tm, t.tk), lambda i, j, k: (i, k)), *specs],
        out_specs=out_spec,
        compiler_params=compiler_params(platform, interpret),
        interpret=interpret,
        name=f"qmatmul_{w.ggml_type.name.lower()}",
    )(x2, *arrays)
    if t.split_k:
        y = jnp.sum(y, axis=0)
    return y.reshape(*lead, N)
