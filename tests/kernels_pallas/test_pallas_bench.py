"""bench/pallas_gpu.py's dry run (interpret mode, tiny shapes, the tiny gemma3 fixture):
the GPU script runs end to end here, and every on-device check it makes passes."""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_pallas_gpu_bench_dry_run(fixtures_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    monkeypatch.setenv("LLAMAY_BACKEND", "auto")  # the script sets it per run
    from bench import pallas_gpu

    rows = pallas_gpu.main(["--dry-run", "--types", "Q4_K"])
    sys.modules.pop("bench.pallas_gpu", None)
    errors = [r for r in rows if r.get("ok") is False]
    assert not errors, errors
    kinds = [r.get("check") or r.get("bench") for r in rows[1:]]
    assert kinds.count("qmatmul") == 2  # 2 shapes
    assert kinds.count("paged_attention") == 2
    assert kinds.count("qmatmul_bandwidth") == 2  # pallas, reference
    assert [r for r in rows if r.get("bench") == "decode"][0]["ok"]
    assert all(
        r["us"] > 0 and r["bytes"] > 0 for r in rows if r.get("bench") == "qmatmul_bandwidth"
    )
