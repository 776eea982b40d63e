"""GGUF block layouts: numpy and jnp dequantisation, quantisation, QTensor and qmatmul."""

from llamay.quant.qtensor import QTensor, qmatmul

__all__ = ["QTensor", "qmatmul"]
