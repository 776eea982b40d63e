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
