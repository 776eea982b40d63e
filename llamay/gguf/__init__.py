"""GGUF files: parse (mmap, zero-copy tensor views) and write. Knows nothing of JAX."""

from llamay.gguf.constants import BLOCK_SIZES, GGMLType, GGUFValueType, tensor_nbytes
from llamay.gguf.reader import GGUFFile, TensorInfo, open_gguf
from llamay.gguf.writer import GGUFWriter, TensorSpec, copy_gguf, tensor_spec, write_gguf

__all__ = [
    "BLOCK_SIZES",
    "GGMLType",
    "GGUFValueType",
    "GGUFFile",
    "GGUFWriter",
    "TensorInfo",
    "TensorSpec",
    "copy_gguf",
    "open_gguf",
    "tensor_nbytes",
    "tensor_spec",
    "write_gguf",
]
