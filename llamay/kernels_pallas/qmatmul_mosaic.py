"""Quantised matmul y = x @ W.T as a Mosaic GPU kernel (Hopper, sm_90+) over the kernel
layout (`layout`), for decode: a matvec / tiny-M kernel on CUDA cores, exact f32 numerics
(its reference: `qmatmul.qmatmul_reference`).

One CTA (a single warpgroup, 128 threads) owns tn = 128·V output columns of tm rows of x
and one of `splits` K ranges. `plgpu.emit_pipeline` streams that K range through SMEM in
`chunk`-element steps (TMA copies of x and of every weight plane, several steps in flight),
and the body walks the chunk one weight row at a time: each row of a plane is loaded from
SMEM into registers as a (tn,) vector with the strided layout of vec_size V, so every
thread owns the same V columns of every plane (q, high, scale, offset) and of the
accumulators, and no value crosses threads. A row is dequantised in registers exactly as
`layout.dequantize_tile` does ((q - zero)·scale + offset, the same f32 products) and
accumulated as acc[m] += x[m, k]·w in f32, x[m, k] read as a scalar from SMEM.

Nibble planes: plane row 16g + j holds elements 32g + j (low nibble) and 32g + 16 + j
(high nibble) of group g, so one row load serves two elements; their high bits come from
group g's words (bit j and 16 + j of the one word for 5-bit; bits 2j of words 2g and 2g+1
for Q6_K) and their scales from group row g (Q6_K: rows 2g and 2g + 1).

Each K range writes its partial sums to [splits, M, N] (no cross-CTA accumulation), added
after the kernel, as the Triton split-K kernel does; `splits` is chosen so that the grid
has about `TARGET_CTAS` CTAs even for one row. Edge blocks (N not a multiple of tn, as
SmolLM2's 576 and 192; M not a multiple of tm) read zeros past the array (TMA's
out-of-bounds fill) and write into the padded rows/columns of that small output; only an
N that is not a multiple of 16 (a row stride TMA cannot describe) pads the planes, a copy.
Prefill (M > `DECODE_MAX_ROWS`) is served by the same kernel but rereads the weights for
every tm rows: the dispatcher sends it to the Triton kernel until a WGMMA tiling exists.

GPU interpret mode (`plgpu.InterpretGPUParams`) runs this kernel on CPU, TMA copies and
barriers simulated; the tests hold it to the reference there and lower it for an
abstract H200 (Mosaic GPU's MLIR lowering; ptxas needs the hardware).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from llamay.kernels_pallas.layout import F32, Format, PackedWeight, codebook_lookup
from llamay.kernels_pallas.qmatmul import _divisor, as_rows, plane_names

LANES = 128  # threads of one warpgroup: the strided layout spreads a row over them
TARGET_CTAS = 2 * 132  # about two CTAs per H100/H200 SM
DECODE_MAX_ROWS = 8  # the row tile: accumulators per thread = tm · V
TMA_ALIGN = 16  # bytes: TMA needs every GMEM row stride a multiple of this
# SMEM per CTA for the pipeline's buffers (H100/H200 allow 227 KiB per block): this
# leaves room for two CTAs per SM; a step (one chunk of x and of every plane) must fit
# twice (double buffering), and as many steps as fit, up to 4, are in flight.
SMEM_BUDGET = 96 * 1024
MAX_STAGES = 4


@dataclass(frozen=True)
class MosaicTiling:
    tm: int  # rows of x per CTA
    tn: int  # output columns per CTA: 128 · V
    chunk: int  # K elements per pipeline step (a multiple of 32)
    splits: int  # K ranges, each its own CTAs and partial sums
    stages: int = 2  # pipeline steps in flight (SMEM buffers per operand)


def step_bytes(fmt: Format, tm: int, tn: int, chunk: int) -> int:
    """SMEM bytes of one pipeline step: a chunk of x and of every plane."""
    itemsize = {"q": 1, "high": 4, "scale": 4, "offset": 4}
    planes = {n: r for n, r in _plane_rows(fmt, chunk).items() if r}
    if not fmt.has_offset:
        planes.pop("offset")
    return 4 * tm * chunk + sum(itemsize[n] * rows * tn for n, rows in planes.items())


def mosaic_tiling_for(M: int, N: int, K: int, fmt: Format) -> MosaicTiling:
    """The tiling for x [M, K] @ W[N, K].T: V = 2 where N allows (256-byte rows of the
    nibble plane per TMA copy), the largest chunk <= 256 dividing K whose two steps fit
    `SMEM_BUDGET`, and split-K up to `TARGET_CTAS`."""
    tm = min(M, DECODE_MAX_ROWS)
    n = -(-N // LANES) * LANES
    tn = 2 * LANES if n % (2 * LANES) == 0 else LANES
    chunk = _divisor(K, 256, 32)
    while 2 * step_bytes(fmt, tm, tn, chunk) > SMEM_BUDGET and chunk > 32:
        chunk = _divisor(K, chunk - 32, 32)
    stages = max(2, min(MAX_STAGES, SMEM_BUDGET // step_bytes(fmt, tm, tn, chunk)))
    blocks = -(-M // tm) * (n // tn)
    steps = K // chunk
    limit = max(TARGET_CTAS // blocks, 1)
    splits = max(s for s in range(1, steps + 1) if steps % s == 0 and s <= limit)
    return MosaicTiling(tm, tn, chunk, splits, stages)


def check_mosaic_tiling(t: MosaicTiling, K: int) -> None:
    if t.tn % LANES or t.chunk % 32 or K % (t.chunk * t.splits):
        raise ValueError(
            f"Mosaic GPU tiling {t} does not fit K={K}: tn must be a multiple of {LANES}, "
            "chunk of 32, and chunk·splits divide K"
        )


def _plane_rows(fmt: Format, chunk: int) -> dict[str, int]:
    """Rows of each plane per K-chunk."""
    return {
        "q": chunk if fmt.bits == 8 else chunk // 2,
        "high": chunk // 32 * fmt.high_bits,
        "scale": chunk // fmt.group,
        "offset": chunk // 32,
    }


def _group(g, planes: dict, x_ref, accs: tuple, *, fmt: Format, layout):
    """acc[m] += Σ_e x[m, e]·w[e, :] over the 32 elements of group g of a chunk."""

    def row(ref, r):
        return plgpu.load(ref.at[r], layout=layout)

    per_group = 32 // fmt.group  # scale rows per group: 1, or 2 (Q6_K)
    scales = [row(planes["scale"], g * per_group + i) for i in range(per_group)]
    offset = row(planes["offset"], g) if "offset" in planes else None

    def add(accs, e, ints):  # element e of the group, its integers q - zero
        w = ints.astype(F32) * scales[e // fmt.group]
        if offset is not None:
            w = w + offset
        return tuple(a + x_ref[m, 32 * g + e] * w for m, a in enumerate(accs))

    if fmt.bits == 8:
        for e in range(32):
            accs = add(accs, e, row(planes["q"], 32 * g + e).astype(jnp.int32) - fmt.zero)
        return accs
    hb = fmt.high_bits
    words = [row(planes["high"], g * hb + i) for i in range(hb)] if hb else []
    for j in range(16):
        b = row(planes["q"], 16 * g + j).astype(jnp.int32)
        lo, hi = b & 0xF, b >> 4
        if hb == 1:  # bit e of the group's word
            lo = lo | (((words[0] >> j) & 1).astype(jnp.int32) << 4)
            hi = hi | (((words[0] >> (16 + j)) & 1).astype(jnp.int32) << 4)
        elif hb == 2:  # bits 2e of the 64-bit pair: word 0 for e < 16, word 1 above
            lo = lo | (((words[0] >> (2 * j)) & 3).astype(jnp.int32) << 4)
            hi = hi | (((words[1] >> (2 * j)) & 3).astype(jnp.int32) << 4)
        if fmt.codebook is not None:  # IQ4_NL / IQ4_XS / MXFP4: nibble -> value
            lo, hi = codebook_lookup(lo, fmt.codebook), codebook_lookup(hi, fmt.codebook)
        else:
            lo, hi = lo - fmt.zero, hi - fmt.zero
        accs = add(accs, j, lo)
        accs = add(accs, 16 + j, hi)
    return accs


def _kernel(x_gmem, *refs, fmt: Format, names: list[str], t: MosaicTiling, k_steps: int):
    *plane_gmem, o_gmem = refs
    mb, nb, sk = lax.axis_index("m"), lax.axis_index("n"), lax.axis_index("k")
    layout = plgpu.Layout.WG_STRIDED((t.tn,), vec_size=t.tn // LANES)
    rows = _plane_rows(fmt, t.chunk)

    def body(_, x_smem, *rest):  # rest: the planes' SMEM refs, then the accumulators
        *plane_smem, carry = rest
        planes = dict(zip(names, plane_smem, strict=True))
        group = functools.partial(_group, planes=planes, x_ref=x_smem, fmt=fmt,
                                  layout=layout)  # fmt: skip
        return lax.fori_loop(0, t.chunk // 32, lambda g, accs: group(g, accs=accs), carry)

    def k_block(kk):
        return sk * k_steps + kk

    specs = [plgpu.BlockSpec((t.tm, t.chunk), lambda kk: (mb, k_block(kk)))]
    specs += [plgpu.BlockSpec((rows[n], t.tn), lambda kk: (k_block(kk), nb)) for n in names]
    init = tuple(plgpu.layout_cast(jnp.zeros((t.tn,), F32), layout) for _ in range(t.tm))
    accs = plgpu.emit_pipeline(
        body,
        grid=(k_steps,),
        in_specs=specs,
        max_concurrent_steps=t.stages,
        init_carry=init,
    )(x_gmem, *plane_gmem)
    for m, acc in enumerate(accs):
        o_gmem[sk, mb * t.tm + m, pl.ds(nb * t.tn, t.tn)] = acc


@functools.partial(jax.jit, static_argnames=("interpret", "tiling"))
def qmatmul_mosaic(
    x: jax.Array, w: PackedWeight, *, interpret=False, tiling: MosaicTiling | None = None
) -> jax.Array:
    """x [..., K] @ W.T -> [..., N] f32 with the Mosaic GPU kernel (W 2-D, kernel layout).
    `interpret`: False on a Hopper GPU, `plgpu.InterpretGPUParams()` to run on CPU."""
    N, K = w.n_rows, w.cols
    x2, lead = as_rows(x, w)
    M = x2.shape[0]
    t = tiling or mosaic_tiling_for(M, N, K, w.fmt)
    check_mosaic_tiling(t, K)
    names = plane_names(w)
    n_pad, m_pad = -N % t.tn, -M % t.tm  # blocks past the edges read zeros (TMA)
    planes = [getattr(w, n) for n in names]
    if N % TMA_ALIGN:  # a uint8 row stride TMA cannot take: pad (copies the planes)
        planes = [jnp.pad(p, ((0, 0), (0, -N % TMA_ALIGN))) for p in planes]
    k_steps = K // t.chunk // t.splits
    grid = ((M + m_pad) // t.tm, (N + n_pad) // t.tn, t.splits)
    kernel = functools.partial(_kernel, fmt=w.fmt, names=names, t=t, k_steps=k_steps)
    y = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((t.splits, M + m_pad, N + n_pad), F32),
        grid=grid,
        grid_names=("m", "n", "k"),
        interpret=interpret,
        kernel_name=f"qmatmul_mosaic_{w.ggml_type.name.lower()}",
    )(x2, *planes)
    return jnp.sum(y, axis=0)[:M, :N].reshape(*lead, N)
