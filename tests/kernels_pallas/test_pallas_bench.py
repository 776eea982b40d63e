"""bench/pallas_gpu.py's dry run (interpret mode, tiny shapes, the tiny qwen3 fixture):
the GPU script runs end to end here, and every on-device check it makes passes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the Mosaic GPU interpreter simulates every CTA of a decode step
def test_pallas_gpu_bench_dry_run(fixtures_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    monkeypatch.setenv("LLAMAY_BACKEND", "auto")  # the script sets both per run
    monkeypatch.setenv("LLAMAY_GPU_KERNELS", "auto")
    from bench import pallas_gpu

    rows = pallas_gpu.main(["--dry-run", "--types", "Q4_K"])
    sys.modules.pop("bench.pallas_gpu", None)
    errors = [r for r in rows if r.get("ok") is False]
    assert not errors, errors
    kinds = [r.get("check") or r.get("bench") for r in rows[1:]]
    checks = [r["impl"] for r in rows if r.get("check") == "qmatmul"]
    assert sorted(checks) == ["mosaic", "mosaic", "triton", "triton"]  # 2 shapes each
    assert kinds.count("paged_attention") == 2
    timed = [r for r in rows if r.get("bench") == "qmatmul_bandwidth"]
    # a square shape and tiny qwen3's Q4_K matrix of <= 256 rows, by both kernels and XLA
    assert {r["shape"] for r in timed} == {"square", "qwen3:blk.0.attn_q.weight"}
    assert sorted(r["impl"] for r in timed) == ["mosaic", "mosaic", "reference", "reference",
                                                "triton", "triton"]  # fmt: skip
    assert all(r["us"] > 0 and r["bytes"] > 0 for r in timed)
    [decode] = [r for r in rows if r.get("bench") == "decode"]
    assert decode["ok"] and decode["mosaic_tok_s"] > 0 and decode["triton_tok_s"] > 0
    assert decode["xla_tok_s"] > 0 and decode["mosaic_weight_mb"] > 0


def test_pallas_gpu_bench_time_budget(fixtures_dir, monkeypatch):
    """Past --budget-s every measurement is emitted as skipped, none run (the device
    session is time-boxed)."""
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    from bench import pallas_gpu

    rows = pallas_gpu.main(["--dry-run", "--types", "Q4_K", "--budget-s", "0"])
    sys.modules.pop("bench.pallas_gpu", None)
    assert len(rows) > 5 and all(r["skipped"] for r in rows[1:]), rows
