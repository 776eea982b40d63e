"""Counts that would create many Python objects from few bytes are capped before anything
is read (llamay.gguf.reader's MAX_*): refused with GGUFBoundsError naming the field, even
when the file is large enough to hold the items."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from llamay.errors import GGUFBoundsError
from llamay.gguf import GGUFFile
from llamay.gguf import reader as R
from llamay.gguf.constants import GGUFValueType


def header(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


def array_of(etype: GGUFValueType, n: int) -> bytes:
    return struct.pack("<IIQ", GGUFValueType.ARRAY, etype, n)  # value type, element type, n


def refused(tmp_path, data: bytes, named: str) -> None:
    path = tmp_path / "h.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFBoundsError, match=named) as e:
            GGUFFile(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "over the limit" in str(e.value)
    assert peak < 16 * len(data) + (1 << 20)


@pytest.mark.parametrize(
    "etype,n",
    [(GGUFValueType.STRING, R.MAX_ARRAY_ITEMS + 1), (GGUFValueType.ARRAY, R.MAX_ARRAY_ITEMS + 1)],
)
def test_long_object_arrays_refused(tmp_path, etype, n):
    """An array of 2**21 + 1 empty strings (or empty arrays), with the file holding them
    all: ~17-26 MB of file that would be ~100+ MB of Python objects."""
    item = struct.pack("<Q", 0) if etype == GGUFValueType.STRING else struct.pack("<IQ", 6, 0)
    data = header(0, 1) + key("tokenizer.ggml.tokens") + array_of(etype, n) + item * n
    refused(tmp_path, data, "tokenizer.ggml.tokens")


def test_tensor_and_metadata_counts_refused(tmp_path):
    refused(tmp_path, header(R.MAX_TENSORS + 1, 0) + bytes(64), "tensor count")
    refused(tmp_path, header(0, R.MAX_METADATA + 1) + bytes(64), "metadata count")


def test_arrays_at_the_cap_still_read(tmp_path):
    n = 100_000
    data = header(0, 1) + key("k") + array_of(GGUFValueType.STRING, n)
    data += b"".join(struct.pack("<Q", 1) + b"abcdefghij"[i % 10 : i % 10 + 1] for i in range(n))
    path = tmp_path / "ok.gguf"
    path.write_bytes(data)
    f = GGUFFile(path)
    assert len(f.metadata["k"]) == n and f.metadata["k"][:3] == ["a", "b", "c"]
