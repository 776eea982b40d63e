"""Which kernels to trace with: decided from `jax.default_backend()` and the environment
when a function is traced (so set the variables before the first call).

`LLAMAY_BACKEND`:
  unset / "auto"       by platform: Pallas kernels on GPU/TPU; on CPU the native kernels
                       (`llamay.kernels_cpu`) where they apply, else XLA's CPU forms;
                       the reference on anything else (Metal: Pallas has no lowering)
  "reference"          the jnp implementations everywhere: no Pallas, no native kernels
                       (on CPU still XLA's CPU forms, `llamay.quant.cpu_dot`: same values)
  "pallas-interpret"   the Pallas kernels in interpret mode on any backend (tests; TPU
                       tiling), "pallas-interpret-gpu" with the GPU (Triton) kernels'
                       tiling/variant, "pallas-interpret-mosaic-gpu" with the Mosaic GPU
                       kernels (GPU interpret mode) and Triton for the rest

On GPU two Pallas lowerings exist. `LLAMAY_GPU_KERNELS`:
  unset / "auto"       Mosaic GPU on compute capability >= 9.0 (Hopper and newer), Triton
                       below (Mosaic GPU has no pre-Hopper TMA/WGMMA)
  "mosaic" / "triton"  that one whatever the device
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax

ENV = "LLAMAY_BACKEND"
CHOICES = (
    "auto", "reference", "pallas-interpret", "pallas-interpret-gpu", "pallas-interpret-mosaic-gpu"
)  # fmt: skip
GPU_KERNELS_ENV = "LLAMAY_GPU_KERNELS"
GPU_KERNEL_CHOICES = ("auto", "mosaic", "triton")
MOSAIC_MIN_CAPABILITY = (9, 0)  # Hopper: TMA, the Mosaic GPU pipeline's copies
_GPU_NAMES = ("gpu", "cuda", "rocm")


@dataclass(frozen=True)
class Backend:
    pallas: bool
    platform: str = "tpu"  # which Pallas kernel variant / tiling: "tpu" or "gpu"
    interpret: bool = False
    mosaic: bool = False  # GPU: the Mosaic GPU kernels where they exist, else Triton
    native: bool = False  # CPU: ask the native kernels (`llamay.kernels_cpu`) first


def device_kind(name: str | None = None) -> str:
    """`jax.default_backend()` (or `name`) as one of "cpu", "gpu", "tpu", "metal", or the
    name itself for anything else. Apple plugins name it differently ("METAL" for
    jax-metal, "mps" in jax-mps): any of those is "metal"."""
    name = (jax.default_backend() if name is None else name).lower()
    if name in _GPU_NAMES:
        return "gpu"
    if name.startswith(("metal", "mps", "apple")):
        return "metal"
    return name


def gpu_kernels(device=None) -> str:
    """ "mosaic" or "triton": `LLAMAY_GPU_KERNELS`, or for "auto" the device's compute
    capability (default: the first device) against `MOSAIC_MIN_CAPABILITY`."""
    choice = os.environ.get(GPU_KERNELS_ENV, "auto") or "auto"
    if choice not in GPU_KERNEL_CHOICES:
        raise ValueError(
            f"{GPU_KERNELS_ENV}={choice!r} is not one of {', '.join(GPU_KERNEL_CHOICES)}"
        )
    if choice != "auto":
        return choice
    device = device or jax.devices()[0]
    capability = getattr(device, "compute_capability", None)  # e.g. "9.0"; ROCm: "gfx..."
    try:
        major_minor = tuple(int(p) for p in str(capability).split("."))
    except ValueError:
        return "triton"
    return "mosaic" if major_minor >= MOSAIC_MIN_CAPABILITY else "triton"


def backend() -> Backend:
    """The backend to trace with now (module docstring)."""
    choice = os.environ.get(ENV, "auto") or "auto"
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r} is not one of {', '.join(CHOICES)}")
    if choice == "reference":
        return Backend(False)
    if choice.startswith("pallas-interpret"):
        gpu = choice.endswith("-gpu")
        return Backend(True, "gpu" if gpu else "tpu", interpret=True, mosaic="mosaic" in choice)
    kind = device_kind()
    if kind == "gpu":
        return Backend(True, "gpu", mosaic=gpu_kernels() == "mosaic")
    if kind == "tpu":
        return Backend(True, "tpu")
    return Backend(False, native=kind == "cpu")
