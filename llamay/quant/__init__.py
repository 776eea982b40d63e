"""GGUF block layouts: numpy and jnp dequantisation, quantisation, QTensor and qmatmul."""

from llamay.quant.qtensor import MixedQTensor, QTensor, qmatmul

__all__ = ["MixedQTensor", "QTensor", "qmatmul"]
