"""`python -m llamay.kernels_cpu`: build the native CPU kernels ahead of time (`make
install`); without a compiler it says so and exits 0 (llamay then takes the XLA path)."""

from llamay.errors import NativeKernelError
from llamay.kernels_cpu.build import build

try:
    print(f"native CPU kernels: {build()}")
except NativeKernelError as e:
    print(f"native CPU kernels not built (llamay will use the XLA path): {e}")
