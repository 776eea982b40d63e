"""Fixtures for the OCR tests: pyctcdecode's sample data (its wheel ships
`tests/sample_data/libri_logits.json` and `bugs_bunny_kenlm.arpa`; the oracle itself,
pinned to numpy<2, is installed apart: `pip install --no-deps pyctcdecode==0.5.0 pygtrie
kenlm`) and the PP-OCRv4
recognizer (ONNX from the `rapidocr-onnxruntime` wheel, converted to GGUF), both
cached in ~/.cache/llamay; tests skip with the reason when they are unavailable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from fixture_data import missing, oracle

PYCTCDECODE = "pyctcdecode==0.5.0"
SAMPLE_FILES = ("libri_logits.json", "bugs_bunny_kenlm.arpa")


@pytest.fixture(scope="session")
def ctc_sample_dir() -> Path:
    """pyctcdecode's sample data: from the installed package, else taken out of its
    wheel (downloaded once into llamay's wheel cache, never installed)."""
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
    try:
        import pyctcdecode

        path = Path(pyctcdecode.__file__).parent / "tests" / "sample_data"
        if all((path / f).is_file() for f in SAMPLE_FILES):
            return path
    except ImportError:
        pass
    import zipfile

    from llamay.errors import FetchError
    from llamay.store.wheel import cache_dir, find_cached_wheel, pip_download, wheel_cache_dir

    out = cache_dir() / "ocr" / "pyctcdecode-sample-data"
    if all((out / f).is_file() for f in SAMPLE_FILES):
        return out
    try:
        wheel = find_cached_wheel(PYCTCDECODE)
        if wheel is None:
            pip_download([PYCTCDECODE], wheel_cache_dir(), progress=False)
            wheel = find_cached_wheel(PYCTCDECODE)
    except FetchError as e:
        missing(f"pyctcdecode's sample data is not available and cannot be fetched: {e}")
    if wheel is None:
        missing(f"{PYCTCDECODE} could not be found in {wheel_cache_dir()}")
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as z:
        for f in SAMPLE_FILES:
            (out / f).write_bytes(z.read(f"pyctcdecode/tests/sample_data/{f}"))
    return out


@pytest.fixture(scope="session")
def libri_logits(ctc_sample_dir) -> np.ndarray:
    return np.array(json.loads((ctc_sample_dir / "libri_logits.json").read_text()))


@pytest.fixture(scope="session")
def bugs_bunny_arpa(ctc_sample_dir) -> Path:
    return ctc_sample_dir / "bugs_bunny_kenlm.arpa"


@pytest.fixture(scope="session")
def ppocr_onnx() -> Path:
    from llamay.errors import FetchError
    from llamay.ocr.ppocr import fetch_onnx

    try:
        return fetch_onnx()
    except FetchError as e:
        missing(f"the PP-OCRv4 recognizer is not available and cannot be fetched: {e}")


@pytest.fixture(scope="session")
def ppocr_gguf(ppocr_onnx) -> Path:
    oracle("onnx")
    from llamay.ocr.ppocr import default_gguf

    return default_gguf()
