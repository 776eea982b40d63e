"""The Pallas kernels on a GPU (written for an H200): each kernel against its reference on
the device, the quantised matmul's achieved bandwidth on decode shapes (Mosaic GPU and
Triton kernels side by side, on square shapes and on every weight shape of the reference
models), and decode tokens/s of real models with Pallas-Mosaic vs Pallas-Triton vs the XLA
path (`LLAMAY_BACKEND=reference`). One JSON object per line; a failing check is reported
(with its error), not raised.

    .venv/bin/python -m bench.pallas_gpu                # on the GPU machine (< 10 minutes)
    .venv/bin/python -m bench.pallas_gpu --dry-run      # anywhere: interpret mode (Mosaic
                                                         # GPU's GPU interpreter), tiny shapes
                                                         # and the tiny qwen3 fixture

Bandwidth counts the bytes the kernel must read (kernel-layout weight planes plus
activations) over the median time of `--reps` calls, against the H200's 4.8 TB/s; the
reference's row uses the GGUF bytes it reads. Decode rows add the kernel-layout weight
bytes read per token and the GB/s they imply. Order: checks, decode, the models' shapes,
the square shapes; whatever would start after `--budget-s` (480 s) is emitted as skipped,
so the run stays under 10 minutes. Not run in CI: tests/kernels_pallas runs the dry run.
No assertions on speed.
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

from bench.tiny_models import tiny_model

PEAK_GBPS = 4800.0  # H200 HBM3e
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# tiny qwen3: Q4_K/Q5_K/Q6_K matrices and a Q3_K head (no kernel), so the Mosaic GPU
# interpreter, which simulates every CTA, never runs a 49152-row head in the dry run
TINY_MODEL = "qwen3"  # bench/tiny_models.py: the tests' tiny models, rebuilt on first use
MODELS = ("smollm2:135m", "gemma3:270m")
DRY_MAX_ROWS = 256  # dry run: model weight shapes up to this many rows


def emit(out: list, **row) -> None:
    out.append(row)
    print(json.dumps(row), flush=True)


DEADLINE = [float("inf")]  # time.monotonic() after which measurements are skipped


def guarded(out: list, what: dict, fn) -> None:
    """Run one check/measurement; on failure emit its error instead of stopping the run;
    past `--budget-s`, emit it as skipped (the device session is time-boxed)."""
    if time.monotonic() > DEADLINE[0]:
        emit(out, **what, skipped="past --budget-s")
        return
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


def kernels(interpret: bool) -> dict:
    """impl -> f(x, PackedWeight): the two GPU lowerings of the quantised matmul."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    from llamay.kernels_pallas.qmatmul import qmatmul_pallas
    from llamay.kernels_pallas.qmatmul_mosaic import qmatmul_mosaic

    gpu_interpret = plgpu.InterpretGPUParams() if interpret else False
    return {
        "triton": lambda x, p: qmatmul_pallas(x, p, platform="gpu", interpret=interpret),
        "mosaic": lambda x, p: qmatmul_mosaic(x, p, interpret=gpu_interpret),
    }


def check_qmatmul(out, types, impls: dict, shapes) -> None:
    from llamay.gguf.constants import GGMLType
    from llamay.kernels_pallas import repack
    from llamay.kernels_pallas.qmatmul import qmatmul_reference

    for name in types:
        for m, n, k in shapes:
            for impl, fn in impls.items():
                what = dict(check="qmatmul", impl=impl, type=name, M=m, N=n, K=k)

                def run(name=name, m=m, n=n, k=k, fn=fn, what=what):
                    w = random_weight(GGMLType[name], n, k)
                    x = jax.random.normal(jax.random.key(m), (m, k), jnp.float32)
                    y = fn(x, repack(w))
                    ref = qmatmul_reference(x, w)
                    scale = jnp.abs(x) @ jnp.abs(w.dequantize()).T
                    err = float(jnp.max(jnp.abs(y - ref) / (scale + 1e-30)))
                    emit(out, **what, max_rel_err=err, ok=bool(err < 1e-5))

                guarded(out, what, run)


def check_paged(out, platform: str, interpret, shape) -> None:
    from llamay.kernels_pallas.paged_attention import (
        paged_attention_pallas,
        paged_attention_reference,
    )

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
            ref = paged_attention_reference(q, kp, vp, table, pos, jnp.int32(1), **kw)
            err = float(jnp.max(jnp.abs(y - ref)))
            emit(out, **what, max_abs_err=err, ok=bool(err < 1e-4))

        guarded(out, what, run)


# -- bandwidth of the quantised matmul on decode shapes ------------------------------------


def model_shapes(models, types, max_rows: int | None = None) -> list[tuple[str, int, int, str]]:
    """(type, N, K, "model:tensor") of every distinct kernel-type matrix of the models (one
    row per token: the decode shapes), read from their GGUF headers."""
    import llamay
    from llamay.kernels_pallas import KERNEL_TYPES

    seen, cases = set(), []
    for name in models:
        tensors = llamay.load(name).gguf.tensors
        for info in tensors.values():
            if len(info.shape) != 2 or info.ggml_type not in KERNEL_TYPES:
                continue
            key = (info.ggml_type.name, *info.shape)
            if key[0] in types and key not in seen and info.shape[0] <= (max_rows or 1 << 62):
                seen.add(key)
                cases.append((*key, f"{Path(str(name)).stem}:{info.name}"))
    return cases


def bandwidth(out, impls: dict, cases, reps: int) -> None:
    """cases: (type, M, N, K, label); each kernel and the XLA reference, timed."""
    from llamay.gguf.constants import GGMLType
    from llamay.kernels_pallas import repack
    from llamay.kernels_pallas.qmatmul import qmatmul_reference

    for name, m, n, k, label in cases:
        what = dict(bench="qmatmul_bandwidth", type=name, M=m, N=n, K=k, shape=label)

        def run(name=name, m=m, n=n, k=k, what=what):
            w = random_weight(GGMLType[name], n, k)
            p = jax.block_until_ready(repack(w))
            x = jnp.ones((m, k), jnp.float32)
            timed = [(impl, jax.jit(fn), p, nbytes(p.q, p.high, p.scale, p.offset, x))
                     for impl, fn in impls.items()]  # fmt: skip
            timed.append(("reference", jax.jit(qmatmul_reference), w, nbytes(w.data, x)))
            for impl, fn, weight, b in timed:
                s = median_seconds(lambda fn=fn, weight=weight: fn(x, weight), reps)
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


def decode_run(model, env: dict, steps: int, prompt: int = 8, page: int = 16):
    """(tokens/s of `steps` batch-1 decode steps, the prompt's last logits, the bytes of
    kernel-layout weights) with the dispatch traced under the environment `env`
    (LLAMAY_BACKEND, LLAMAY_GPU_KERNELS); Pallas runs use weights repacked once."""
    from llamay.arch import architecture_of
    from llamay.kernels import repack_weights
    from llamay.kernels_pallas import PackedWeight
    from llamay.kv.pages import new_paged_kv
    from llamay.model.bind import bind
    from llamay.model.forward import forward

    os.environ.update(env)
    cfg, arch = model.config, architecture_of(model.config)
    # GGUF-block QTensors, as bound on GPU/TPU (on one CPU device `bind` would repack)
    w = bind(model.gguf, model.arch, cfg.n_layers, cfg.numerics, repack=False)
    w = w if env[BACKEND_ENV] == "reference" else repack_weights(w)
    packed = [x for x in jax.tree.leaves(w, is_leaf=lambda a: isinstance(a, PackedWeight))
              if isinstance(x, PackedWeight)]  # fmt: skip
    weight_bytes = sum(nbytes(p.q, p.high, p.scale, p.offset) for p in packed)
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
    return steps / (time.perf_counter() - t), np.asarray(first), weight_bytes


BACKEND_ENV, GPU_KERNELS_ENV = "LLAMAY_BACKEND", "LLAMAY_GPU_KERNELS"


def decode_envs(dry_run: bool) -> dict[str, dict]:
    """path -> the environment that traces it: the XLA path, Pallas with the Triton
    kernels, Pallas with the Mosaic GPU kernels (the dry run: their interpreters)."""
    if dry_run:
        pallas = {"triton": "pallas-interpret-gpu", "mosaic": "pallas-interpret-mosaic-gpu"}
        envs = {k: {BACKEND_ENV: v, GPU_KERNELS_ENV: "auto"} for k, v in pallas.items()}
    else:
        envs = {k: {BACKEND_ENV: "auto", GPU_KERNELS_ENV: k} for k in ("triton", "mosaic")}
    return {"xla": {BACKEND_ENV: "reference", GPU_KERNELS_ENV: "auto"}, **envs}


def decode_speed(out, models, envs: dict, steps: int) -> None:
    import llamay

    for name in models:
        what = dict(bench="decode", model=str(name), steps=steps)

        def run(name=name, what=what):
            m = llamay.load(name)
            runs = {path: decode_run(m, env, steps) for path, env in envs.items()}
            ref_tps, ref_logits, _ = runs["xla"]
            row, ok = {}, True
            for path, (tps, logits, weight_bytes) in runs.items():
                row[f"{path}_tok_s"] = round(tps, 3)
                if path == "xla":
                    continue
                err = float(np.max(np.abs(logits - ref_logits)) / np.max(np.abs(ref_logits)))
                gbps = tps * weight_bytes / 1e9
                row |= {f"{path}_vs_xla": round(tps / ref_tps, 2), f"{path}_logits_rel_err": err,
                        f"{path}_weight_mb": round(weight_bytes / 1e6, 3),
                        f"{path}_weight_gb_s": round(gbps, 1),
                        f"{path}_pct_peak": round(100 * gbps / PEAK_GBPS, 1)}  # fmt: skip
                ok = ok and err < 1e-4
            if "mosaic_tok_s" in row and "triton_tok_s" in row:
                row["mosaic_vs_triton"] = round(row["mosaic_tok_s"] / row["triton_tok_s"], 2)
            emit(out, **what, **row, ok=ok)

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
    ap.add_argument(
        "--budget-s", type=float, default=480, help="skip what would start after this long"
    )
    args = ap.parse_args(argv)
    out: list[dict] = []
    emit(
        out,
        info="pallas_gpu",
        backend=jax.default_backend(),
        devices=[d.device_kind for d in jax.devices()],
        dry_run=args.dry_run,
    )
    types = args.types.split(",")
    if args.dry_run:
        interpret, platform = True, "gpu"
        check_shapes = [(1, 64, 256), (20, 48, 256)]
        paged_shape = (2, 4, 2, 16, 4, 6)
        squares, models, steps, reps = [(1, 64, 256)], [tiny_model(TINY_MODEL)], 1, 1
        max_rows = DRY_MAX_ROWS
    else:
        interpret, platform = False, "gpu"
        check_shapes = [(1, 4096, 4096), (256, 2048, 2048)]
        paged_shape = (8, 32, 8, 128, 16, 64)
        squares = [(1, 4096, 4096), (1, 14336, 4096), (1, 4096, 14336)]  # last: if time
        models, steps, reps = args.models.split(","), args.steps, args.reps
        max_rows = None
    DEADLINE[0] = time.monotonic() + args.budget_s
    impls = kernels(interpret)
    check_qmatmul(out, types, impls, check_shapes)
    check_paged(out, platform, interpret, paged_shape)
    decode_speed(out, models, decode_envs(args.dry_run), steps)
    # the models' decode shapes first, then the square ones
    cases = [(t, 1, n, k, label) for t, n, k, label in model_shapes(models, types, max_rows)]
    cases += [(t, m, n, k, "square") for m, n, k in squares for t in types]
    bandwidth(out, impls, cases, reps)
    return out


if __name__ == "__main__":
    main()
