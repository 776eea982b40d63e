"""Shared fixtures of the native CPU kernels' tests."""

from __future__ import annotations

import pytest

from llamay.kernels_cpu import build


@pytest.fixture(scope="module")
def native_kernels():
    """LLAMAY_CPU_KERNELS=native for a module: the kernels must build here (a test that
    silently took the XLA path would pass). Modules use it with
    `pytestmark = pytest.mark.usefixtures("native_kernels")`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(build.ENV, "native")
        yield


@pytest.fixture
def drop_compiler(monkeypatch, tmp_path):
    """A function that takes the compiler away for the rest of a test: LLAMAY_CPU_KERNELS
    =auto, an empty cache, LLAMAY_CXX naming no file, nothing registered or failed yet in
    this process; the native kernels then return None (the dispatcher takes the XLA path).
    Called mid-test, after the parts that run the built kernels from the real cache."""

    def drop():
        mp = monkeypatch
        mp.setenv(build.ENV, "auto")
        mp.setenv("LLAMAY_CACHE", str(tmp_path))
        mp.setenv("LLAMAY_CXX", str(tmp_path / "no-such-c++"))
        mp.setattr(build, "_failed", {})
        build._registered.cache_clear()

    yield drop
    build._registered.cache_clear()  # the next test registers from the real cache again
