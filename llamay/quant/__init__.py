"""GGUF block layouts: numpy and jnp dequantisation, quantisation, the matrix protocol
(`Matrix`) with its GGUF-block and CPU forms, and the jnp reference matmul `qmatmul`."""

from llamay.quant.act_quant import (
    VEC_DOT_TYPES,
    Q8Acts,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_k,
    round_activations,
)
from llamay.quant.cpu_dot import AffineQTensor
from llamay.quant.jnp_dequant import dequantize_jnp
from llamay.quant.layouts import LAYOUTS, BlockLayout, layout_of
from llamay.quant.matrix import Matrix, is_matrix
from llamay.quant.np_dequant import dequantize
from llamay.quant.qtensor import MixedQTensor, QTensor, qmatmul
from llamay.quant.quantize import quantize

__all__ = [
    "LAYOUTS",
    "AffineQTensor",
    "VEC_DOT_TYPES",
    "BlockLayout",
    "Matrix",
    "MixedQTensor",
    "Q8Acts",
    "QTensor",
    "dequantize",
    "dequantize_jnp",
    "is_matrix",
    "layout_of",
    "qmatmul",
    "quantize",
    "quantize_q8_0",
    "quantize_q8_1",
    "quantize_q8_k",
    "round_activations",
]
