"""Building the native kernels: the XLA path with one clear log line when the compiler is
missing (auto), an error naming it when native kernels were asked for, LLAMAY_CPU_KERNELS
=xla builds nothing, and two processes building into an empty cache at once both get a
working library."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from llamay.errors import NativeKernelError
from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu import build
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.quant import QTensor
from llamay.quant.quantize import random_blocks


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache and no variant registered or failed yet in this process."""
    monkeypatch.setenv("LLAMAY_CACHE", str(tmp_path))
    monkeypatch.setattr(build, "_failed", {})
    build._registered.cache_clear()
    yield tmp_path
    build._registered.cache_clear()


def _matmul():
    w = QTensor.from_raw(random_blocks(GGMLType.Q8_0, 8, 64), GGMLType.Q8_0)
    return qmatmul_native(jnp.ones((1, 64), jnp.float32), w, "exact")


def test_missing_compiler_falls_back_with_one_log_line(fresh, monkeypatch, caplog):
    monkeypatch.setenv("LLAMAY_CXX", str(fresh / "no-such-c++"))
    monkeypatch.setenv(build.ENV, "auto")
    with caplog.at_level(logging.WARNING, logger="llamay.kernels_cpu"):
        assert _matmul() is None  # the caller takes the XLA path
        assert _matmul() is None
    lines = [r.getMessage() for r in caplog.records if r.name == "llamay.kernels_cpu"]
    assert len(lines) == 1
    assert "no-such-c++" in lines[0] and "C++17 compiler" in lines[0]
    assert not list(fresh.glob("kernels_cpu/*.so"))


def test_missing_compiler_is_an_error_when_native_is_asked_for(fresh, monkeypatch):
    monkeypatch.setenv("LLAMAY_CXX", str(fresh / "no-such-c++"))
    monkeypatch.setenv(build.ENV, "native")
    with pytest.raises(NativeKernelError, match="no-such-c\\+\\+"):
        _matmul()


def test_a_failing_build_falls_back(fresh, monkeypatch):
    fake = fresh / "broken-c++"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo broken 1; exit 0; fi\n"
                    "echo 'error: no luck' >&2; exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("LLAMAY_CXX", str(fake))
    monkeypatch.setenv(build.ENV, "auto")
    assert _matmul() is None
    with pytest.raises(NativeKernelError, match="no luck"):
        build.build()
    assert not list(fresh.glob("kernels_cpu/*.so*"))  # no temporary left behind


def test_xla_choice_builds_nothing(fresh, monkeypatch):
    monkeypatch.setenv(build.ENV, "xla")
    assert _matmul() is None
    assert not (fresh / "kernels_cpu").exists()


def test_an_unknown_choice_is_an_error(fresh, monkeypatch):
    monkeypatch.setenv(build.ENV, "fast")
    with pytest.raises(NativeKernelError, match="LLAMAY_CPU_KERNELS='fast'"):
        _matmul()


_CHILD = """
import sys
import jax.numpy as jnp, numpy as np
from llamay.gguf.constants import GGMLType
from llamay.kernels_cpu import build
from llamay.kernels_cpu.qmatmul import qmatmul_native
from llamay.quant import QTensor, dequantize
from llamay.quant.quantize import random_blocks
raw = random_blocks(GGMLType.Q4_1, 8, 64)
y = qmatmul_native(jnp.ones((1, 64), jnp.float32), QTensor.from_raw(raw, GGMLType.Q4_1), "exact")
want = dequantize(raw, GGMLType.Q4_1).reshape(8, 64).sum(-1)
assert np.allclose(np.asarray(y)[0], want, rtol=1e-5, atol=1e-6)
print(build.library_path())
"""


def test_two_processes_building_at_once_both_succeed(tmp_path):
    env = dict(os.environ, LLAMAY_CACHE=str(tmp_path), LLAMAY_CPU_KERNELS="native")
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(paths) == 1
    assert [p.name for p in (tmp_path / "kernels_cpu").glob("*.so*")] == [
        paths.pop().split("/")[-1]
    ]
