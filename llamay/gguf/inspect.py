"""A short summary of a GGUF file, for `llamay show` and logs."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from llamay.gguf.reader import GGUFFile

# llama.cpp's `general.file_type` codes (llama_ftype), the name of the "mostly" type.
FILE_TYPES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
}


def summary(src: GGUFFile | str | os.PathLike) -> dict[str, Any]:
    """Plain-data summary: architecture, name, tensor count, tensor types by count
    (most first), parameter count, context length, whether a chat template is
    present, and a few more fields that are cheap to read (JSON-serialisable)."""
    own = not isinstance(src, GGUFFile)
    f = GGUFFile(src) if own else src
    try:
        meta = f.metadata
        arch = f.architecture
        counts = Counter(t.ggml_type.name for t in f.tensors.values())
        file_type = meta.get("general.file_type")
        tokens = meta.get("tokenizer.ggml.tokens")

        def arch_key(name: str) -> Any:
            return meta.get(f"{arch}.{name}") if arch else None

        return {
            "path": str(f.path),
            "file_size": f.file_size,
            "gguf_version": f.version,
            "architecture": arch,
            "name": meta.get("general.name"),
            "file_type": FILE_TYPES.get(file_type, file_type) if file_type is not None else None,
            "tensor_count": len(f.tensors),
            "tensor_types": dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
            "parameter_count": sum(t.n_elements for t in f.tensors.values()),
            "tensor_bytes": sum(t.nbytes for t in f.tensors.values()),
            "context_length": arch_key("context_length"),
            "embedding_length": arch_key("embedding_length"),
            "block_count": arch_key("block_count"),
            "metadata_count": len(meta),
            "tokenizer": meta.get("tokenizer.ggml.model"),
            "vocab_size": len(tokens) if tokens is not None else None,
            "has_chat_template": any(k.startswith("tokenizer.chat_template") for k in meta),
        }
    finally:
        if own:
            f.close()
