"""The Pallas kernels on a GPU (written for an H200): each kernel against its reference on
the device, the quantised matmul's achieved bandwidth on decode shapes, and decode
tokens/s of real models with the Pallas dispatch vs `LLAMAY_BACKEND=reference`.
One JSON object per line; a failing check is reported (with its error), not raised.

    .venv/bin/python -m bench.pallas_gpu                # on the GPU machine (< 10 minutes)
    .venv/bin/python -m bench.pallas_gpu --dry-run      # anywhere: interpret mode, tiny
                                                         # shapes and the tiny gemma3 fixture

Bandwidth counts the bytes the kernel must read (kernel-layout weight planes plus
activations) over the median time of `--reps` calls, against the H200's 4.8 TB/s; the
reference's row uses the GGUF bytes it reads. Not run in CI: tests/kernels_pallas runs
the dry run. No assertions on speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

PEAK_GBPS = 4800.0  # H200 HBM3e
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
TINY_MODEL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tiny" / "gemma3.gguf"
MODELS = ("smollm2:135m", "gemma3:270m")


def emit(out: list, **row) -> None:
    out.append(row)
    print(json.dumps(row), flush=True)


def guarded(out: list, what: dict, fn) -> None:
    """Run one check/measurement; on failure emit its error instead of stopping the run."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- a kernel that does not lower is a result
        emit(out, **what, ok=False, error=f"{type(e).__name__}: {e}"[:2000])
        traceback.print_exc(file=sys.stderr)


def median_seconds(fn, reps: int) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def random_weight(t, n: int, k: int, seed: int = 0):
    """Random well-formed blocks of GGML type t: random quant bits, finite f16 scales."""
    from llamay.quant import QTensor
    from llamay.quant.quantize import random_blocks

    return QTensor.from_raw(random_blocks(t, n, k, seed, scales=(-0.05, 0.05)), t)


def nbytes(*arrays) -> int:
    return sum(int(a.size) * a.dtype.itemsize for a in arrays if a is not None)


# -- checks: kernel vs reference on the device --------------------------------------------


def check_qmatmul(out, types, platform: str, interpret, shapes) -> None:
    from llamay.gguf.constants import GGMLType
    from llamay.kernels_pallas import repack
    from llamay.kernels_pallas.qmatmul import qmatmul_pallas, qmatmul_reference

    for name in types:
        for m, n, k in shapes:
            what = dict(check="qmatmul", type=name, M=m, N=n, K=k)

            def run(name=name, m=m, n=n, k=k, what=what):
                w = random_weight(GGMLType[name], n, k)
                x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32)
                y = qmatmul_pallas(x, repack(w), platform=platform, interpret=interpret)
                ref = qmatmul_reference(x, w)
                scale = jnp.abs(x) @ jnp.abs(w.dequantize()).T
                err = float(jnp.max(jnp.abs(y - ref) / (scale + 1e-30)))
                emit(out, **what, max_rel_err=err, ok=bool(err < 1e-5))

            guarded(out, what, run)


def check_paged(out, platform: str, interpret, shape) -> None:
    from llamay.arch.paged import paged_attention
    from llamay.kernels_pallas.paged_attention import paged_attention_pallas

    B, H, K, D, ps, M = shape
    for window, cap in ((None, None), (4 * ps, 50.0)):
        what = dict(
            check="paged_attention",
            B=B,
            H=H,
            K=K,
            D=D,
            page=ps,
            pages=M,
            window=window,
            softcap=cap,
        )

        def run(window=window, cap=cap, what=what):
            rng = np.random.default_rng(0)
            P = B * M + 1
            q = jnp.asarray(rng.standard_normal((B, 1, H, D)), jnp.float32)
            kp = jnp.asarray(rng.standard_normal((2, P, ps, K, D)), jnp.float32)
            vp = jnp.asarray(rng.standard_normal((2, P, ps, K, D)), jnp.float32)
            table = jnp.asarray(1 + rng.permutation(B * M).reshape(B, M), jnp.int32)
            pos = jnp.asarray(rng.integers(0, M * ps, (B, 1)), jnp.int32)
            w = None if window is None else jnp.int32(window)
            kw = dict(scale=D**-0.5, window=w, softcap=cap)
            y = paged_attention_pallas(
                q, kp, vp, table, pos, jnp.int32(1), platform=platform, interpret=interpret, **kw
            )
            ref = paged_attention(q, kp, vp, table, pos, jnp.int32(1), **kw)
            err = float(jnp.max(jnp.abs(y - ref)))
            emit(out, **what, max_abs_err=err, ok=bool(err < 1e-4))

        guarded(out, what, run)


# -- bandwidth of the quantised matmul on decode shapes ------------------------------------


def bandwidth(out, types, platform: str, interpret, shapes, reps: int) -> None:
    from llamay.gguf.constants import GGMLType
    from llamay.kernels_pallas import repack
    from llamay.kernels_pallas.qmatmul import qmatmul_pallas, qmatmul_reference

    for name in types:
        for m, n, k in shapes:
            what = dict(bench="qmatmul_bandwidth", type=name, M=m, N=n, K=k)

            def run(name=name, m=m, n=n, k=k, what=what):
                w = random_weight(GGMLType[name], n, k)
                p = jax.block_until_ready(repack(w))
                x = jnp.ones((m, k), jnp.float32)
                kern = jax.jit(
                    lambda x, p: qmatmul_pallas(x, p, platform=platform, interpret=interpret)
                )
                ref = jax.jit(qmatmul_reference)
                s_k = median_seconds(lambda: kern(x, p), reps)
                s_r = median_seconds(lambda: ref(x, w), reps)
                b_k = nbytes(p.q, p.high, p.scale, p.offset, x)
                b_r = nbytes(w.data, x)
                for impl, s, b in (("pallas", s_k, b_k), ("reference", s_r, b_r)):
                    gbps = b / s / 1e9
                    emit(
                        out,
                        **what,
                        impl=impl,
                        us=round(s * 1e6, 1),
                        bytes=b,
                        gb_s=round(gbps, 1),
                        pct_peak=round(100 * gbps / PEAK_GBPS, 1),
                    )

            guarded(out, what, run)


# -- decode tokens/s of a model through the paged path -------------------------------------


def decode_run(model, choice: str, steps: int, prompt: int = 8, page: int = 16):
    """(tokens/s of `steps` batch-1 decode steps, the prompt's last logits) with the dispatch
    traced under LLAMAY_BACKEND=choice; the Pallas run uses weights repacked once."""
    from llamay.arch import architecture_of
    from llamay.kernels_pallas import dispatch, repack_weights
    from llamay.kv.pages import new_paged_kv
    from llamay.model.bind import bind
    from llamay.model.forward import forward

    os.environ[dispatch.ENV] = choice
    cfg, arch = model.config, architecture_of(model.config)
    # GGUF-block QTensors, as bound on GPU/TPU (on one CPU device `bind` would repack)
    w = bind(model.gguf, model.arch, cfg.n_layers, cfg.numerics, repack=False)
    w = w if choice == "reference" else repack_weights(w)
    M = -(-(prompt + steps + 1) // page)
    kv = new_paged_kv(
        cfg.n_layers, 1 + M, page, cfg.n_kv_heads, cfg.head_dim, model.runtime.kv_dtype
    )
    table = jnp.arange(1, M + 1, dtype=jnp.int32)[None]

    def step(w, kv, toks, pos):  # -> (next token [1], its logits [1, V], kv)
        x, kv, _ = forward(cfg, w, kv, toks, pos, page_table=table)
        logits = arch.head(cfg, w, x[:, -1:])[:, 0]
        return jnp.argmax(logits, -1).astype(jnp.int32), logits, kv

    step = jax.jit(step, donate_argnums=1)  # a fresh jit: traced under this choice
    ids = jnp.asarray(np.random.default_rng(0).integers(100, 1000, (1, prompt)), jnp.int32)
    tok, first, kv = step(w, kv, ids, jnp.arange(prompt, dtype=jnp.int32)[None])
    tok, _, kv = step(w, kv, tok[:, None], jnp.full((1, 1), prompt, jnp.int32))  # compile
    jax.block_until_ready(tok)
    t = time.perf_counter()
    for i in range(steps):
        tok, _, kv = step(w, kv, tok[:, None], jnp.full((1, 1), prompt + 1 + i, jnp.int32))
    jax.block_until_ready(tok)
    return steps / (time.perf_counter() - t), np.asarray(first)


def decode_speed(out, models, pallas_choice: str, steps: int) -> None:
    import llamay

    for name in models:
        what = dict(bench="decode", model=str(name), steps=steps)

        def run(name=name, what=what):
            m = llamay.load(name)
            ref_tps, ref_logits = decode_run(m, "reference", steps)
            tps, logits = decode_run(m, pallas_choice, steps)
            err = float(np.max(np.abs(logits - ref_logits)) / np.max(np.abs(ref_logits)))
            emit(
                out,
                **what,
                pallas_tok_s=round(tps, 1),
                reference_tok_s=round(ref_tps, 1),
                speedup=round(tps / ref_tps, 2),
                logits_rel_err=err,
                ok=bool(err < 1e-4),
            )

        guarded(out, what, run)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="interpret mode, tiny shapes and the tiny gemma3 fixture (any machine)",
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=128, help="decode steps timed per model")
    ap.add_argument("--reps", type=int, default=20, help="timed calls per bandwidth shape")
    ap.add_argument("--types", default=",".join(TYPES), help="GGML types to check and time")
    args = ap.parse_args(argv)
    out: list[dict] = []
    emit(
        out,
        info="pallas_gpu",
        backend=jax.default_backend(),
        devices=[d.device_kind for d in jax.devices()],
        dry_run=args.dry_run,
    )
    if args.dry_run:
        platform, interpret, choice = "gpu", True, "pallas-interpret-gpu"
        check_shapes = [(1, 64, 256), (20, 48, 256)]
        paged_shape = (2, 4, 2, 16, 4, 6)
        bw_shapes, models, steps, reps = [(1, 64, 256)], [TINY_MODEL], 2, 1
    else:
        platform, interpret, choice = "gpu", False, "auto"
        check_shapes = [(1, 4096, 4096), (256, 2048, 2048)]
        paged_shape = (8, 32, 8, 128, 16, 64)
        bw_shapes = [(1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336)]
        models, steps, reps = args.models.split(","), args.steps, args.reps
    types = args.types.split(",")
    check_qmatmul(out, types, platform, interpret, check_shapes)
    check_paged(out, platform, interpret, paged_shape)
    bandwidth(out, types, platform, interpret, bw_shapes, reps)
    decode_speed(out, models, choice, steps)
    return out


if __name__ == "__main__":
    main()
