"""Numpy dequantisation of GGUF tensor bytes (host side: loading, tests, tools).

Bit-exact against gguf-py's `gguf.quants.dequantize` and ggml's `to_float` for
every supported type (see `formulas.py` for why the order of operations does not
matter).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from llamay.gguf.constants import GGMLType
from llamay.quant.formulas import dequantize_blocks
from llamay.quant.layouts import NUMPY, blocks_of, layout_of

# Blocks per vectorised step: large enough to amortise numpy's per-call cost,
# small enough that the temporaries stay in cache and memory stays flat.
_CHUNK_ELEMS = 1 << 18


def dequantize(raw: np.ndarray, ggml_type: GGMLType | int) -> np.ndarray:
    """uint8 [..., row_bytes] -> float32 [..., n_cols] (n_cols = blocks per row × block size).

    Raises UnsupportedTensorTypeError for types without a dequantiser.
    """
    lay = layout_of(ggml_type)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    blocks = blocks_of(NUMPY, raw, lay)
    out = map_blocks(
        lambda b: dequantize_blocks(NUMPY, lay, b), blocks, lay.block_elems, np.float32
    )
    return out.reshape(*raw.shape[:-1], -1)


def map_blocks(fn: Callable, blocks: np.ndarray, out_width: int, dtype) -> np.ndarray:
    """Apply `fn` ([n, w] -> [n, out_width]) to [..., w] blocks in bounded chunks.

    Returns [..., out_width]. Chunking keeps temporaries small (a 262144-row
    embedding would otherwise need several GiB of them).
    """
    flat_in = blocks.reshape(-1, blocks.shape[-1])
    out = np.empty((flat_in.shape[0], out_width), dtype=dtype)
    step = max(1, _CHUNK_ELEMS // max(out_width, blocks.shape[-1]))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for i in range(0, flat_in.shape[0], step):
            out[i : i + step] = fn(flat_in[i : i + step])
    return out.reshape(*blocks.shape[:-1], out_width)
