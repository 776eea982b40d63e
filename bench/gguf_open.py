"""Time `GGUFFile(path)` (header, metadata and tensor-info parse; tensor data stays
mapped) on the reference models, and print one JSON object.

    python bench/gguf_open.py [--repeat N] [--gguf-py] [PATH ...]

Without paths: the reference models from the store (`smollm2:135m`, `gemma3:270m`),
else their dev copies in ~/.cache/llamay/models. `--gguf-py` also times gguf-py's
GGUFReader once per file, for comparison (slow: ~18 s on gemma3).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llamay.gguf import GGUFFile, reader  # noqa: E402

DEV_MODELS = Path.home() / ".cache" / "llamay" / "models"
DEFAULTS = {
    "smollm2:135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3:270m": "gemma-3-270m-q4_k_m.gguf",
}


def default_paths() -> list[Path]:
    out = []
    for name, filename in DEFAULTS.items():
        try:
            from llamay.store import resolve

            out.append(Path(resolve(name)))
            continue
        except Exception:  # noqa: BLE001 (no store, no network: fall back to the dev copy)
            pass
        if (DEV_MODELS / filename).is_file():
            out.append(DEV_MODELS / filename)
    return out


def time_open(path: Path, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f = GGUFFile(path)
        times.append(time.perf_counter() - t0)
        f.close()
    with GGUFFile(path) as f:
        strings = sum(
            len(v)
            for k, v in f.metadata.items()
            if isinstance(v, list)
            and f.metadata_types[k][1] is not None
            and f.metadata_types[k][1].name == "STRING"
        )
        info = {
            "architecture": f.architecture,
            "file_bytes": f.file_size,
            "header_bytes": f.data_offset,
            "metadata_entries": len(f.metadata),
            "strings_in_arrays": strings,
            "tensors": len(f.tensors),
        }
    # the same parse with every string array decoded string by string (the fallback path)
    saved, reader._BULK_STRINGS = reader._BULK_STRINGS, 1 << 62
    try:
        slow = []
        for _ in range(max(1, repeat // 3)):
            t0 = time.perf_counter()
            GGUFFile(path).close()
            slow.append(time.perf_counter() - t0)
    finally:
        reader._BULK_STRINGS = saved
    return {
        "path": str(path),
        **info,
        "open_ms_min": round(min(times) * 1e3, 2),
        "open_ms_median": round(statistics.median(times) * 1e3, 2),
        "open_ms_first": round(times[0] * 1e3, 2),
        "per_string_path_ms_min": round(min(slow) * 1e3, 2),
        "repeat": repeat,
    }


def time_gguf_py(path: Path) -> float:
    import gguf

    t0 = time.perf_counter()
    r = gguf.GGUFReader(str(path))
    for field in r.fields.values():
        field.contents()
    return round((time.perf_counter() - t0) * 1e3, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--gguf-py", action="store_true", help="also time gguf-py's reader")
    args = ap.parse_args()
    paths = args.paths or default_paths()
    results = []
    for p in paths:
        r = time_open(p, args.repeat)
        if args.gguf_py:
            r["gguf_py_ms"] = time_gguf_py(p)
        results.append(r)
    print(
        json.dumps(
            {
                "bench": "gguf_open",
                "python": platform.python_version(),
                "machine": platform.machine(),
                "bulk_string_threshold": reader._BULK_STRINGS,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
