"""GGUF reader: mmap the file, parse header, metadata and tensor infos, hand out
zero-copy numpy views of tensor data.

Every count, length and offset read from the file is checked against the bytes
that remain before anything is allocated from it, so a corrupt file raises a
specific `GGUFError` naming the field instead of a MemoryError or a crash.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamay.errors import (
    GGUFBoundsError,
    GGUFMagicError,
    GGUFTensorError,
    GGUFTruncatedError,
    GGUFValueTypeError,
    GGUFVersionError,
)
from llamay.gguf.constants import (
    BLOCK_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSIONS,
    VALUE_DTYPES,
    GGMLType,
    GGUFValueType,
)

GGML_MAX_DIMS = 4
# Smallest possible encoding of one tensor info: name length (8), n_dims (4),
# one dim (8), type (4), offset (8).
_MIN_TENSOR_INFO_BYTES = 32
# Smallest encoding of one metadata entry: key length (8), value type (4), one byte.
_MIN_KV_BYTES = 13


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives in the file and how it is laid out.

    `ne` is ggml's order (ne[0] is the fastest-varying, the row length);
    `shape` is numpy's order (the reverse).
    """

    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLType
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf: memoryview, path: str):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def remaining(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > self.size:
            raise GGUFTruncatedError(
                f"{self.path}: file ends while reading {what} "
                f"(need {n} bytes at offset {self.pos}, file has {self.size})"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        return int.from_bytes(self.take(4, what), "little")

    def u64(self, what: str) -> int:
        return int.from_bytes(self.take(8, what), "little")

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 element count, checked against the bytes left in the file."""
        n = self.u64(what)
        if n * min_item_bytes > self.remaining():
            raise GGUFBoundsError(
                f"{self.path}: {what} is {n}, but only {self.remaining()} bytes remain "
                f"(at least {min_item_bytes} per item needed)"
            )
        return n

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        if n > self.remaining():
            raise GGUFBoundsError(
                f"{self.path}: {what} claims {n} bytes, only {self.remaining()} remain"
            )
        return _decode(self.take(n, what))

    def array(self, dtype: np.dtype, n: int, what: str) -> np.ndarray:
        raw = self.take(n * dtype.itemsize, what)
        return np.frombuffer(raw, dtype=dtype, count=n).copy()


def _decode(raw: memoryview) -> str:
    b = bytes(raw)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        # Some vocabularies carry a few invalid byte strings; keep them readable.
        return b.decode("utf-8", errors="replace")


def _value_type(code: int, what: str, path: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise GGUFValueTypeError(f"{path}: {what} has unknown value type {code}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, what: str, depth: int = 0) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(what)
    if vtype == GGUFValueType.ARRAY:
        if depth > 8:
            raise GGUFValueTypeError(f"{cur.path}: {what} nests arrays too deeply")
        etype = _value_type(cur.u32(f"element type of {what}"), what, cur.path)
        if etype in VALUE_DTYPES:
            dtype = VALUE_DTYPES[etype]
            n = cur.count(f"length of {what}", dtype.itemsize)
            arr = cur.array(dtype, n, what)
            return arr.astype(bool) if etype == GGUFValueType.BOOL else arr
        n = cur.count(f"length of {what}", 8)
        if etype == GGUFValueType.STRING:
            return [cur.string(f"{what}[{i}]") for i in range(n)]
        return [_read_value(cur, etype, f"{what}[{i}]", depth + 1) for i in range(n)]
    dtype = VALUE_DTYPES[vtype]
    v = np.frombuffer(cur.take(dtype.itemsize, what), dtype=dtype)[0]
    return bool(v) if vtype == GGUFValueType.BOOL else v.item()


class GGUFFile:
    """An open GGUF file. Tensor data stays in the mmap; `raw()` returns views of it.

    Use as a context manager, or call `close()`; views handed out keep the map alive.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise GGUFTruncatedError(f"{self.path}: file is empty")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(self._mmap)
        try:
            self._parse(view)
        except BaseException:
            view.release()
            self.close()
            raise
        view.release()

    # -- parsing ---------------------------------------------------------------

    def _parse(self, buf: memoryview) -> None:
        path = str(self.path)
        cur = _Cursor(buf, path)
        magic = bytes(cur.take(4, "magic"))
        if magic != GGUF_MAGIC:
            raise GGUFMagicError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        self.version = cur.u32("version")
        if self.version not in GGUF_VERSIONS:
            raise GGUFVersionError(
                f"{path}: GGUF version {self.version} is not supported (llamay reads 2 and 3)"
            )
        n_tensors = cur.count("tensor count", _MIN_TENSOR_INFO_BYTES)
        n_kv = cur.count("metadata count", _MIN_KV_BYTES)

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = _value_type(cur.u32(f"type of {key!r}"), repr(key), path)
            subtype = None
            if vtype == GGUFValueType.ARRAY:
                # Peek the element type without consuming it (for the writer's round trip).
                subtype = _value_type(
                    int.from_bytes(buf[cur.pos : cur.pos + 4], "little"), repr(key), path
                ) if cur.remaining() >= 4 else None
            if key in self.metadata:
                raise GGUFTensorError(f"{path}: metadata key {key!r} appears twice")
            self.metadata[key] = _read_value(cur, vtype, f"metadata {key!r}")
            self.metadata_types[key] = (vtype, subtype)

        align = self.metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise GGUFTensorError(f"{path}: general.alignment {align!r} is not a power of two")
        self.alignment = align

        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor #{i} name")
            n_dims = cur.u32(f"n_dims of tensor {name!r}")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise GGUFTensorError(f"{path}: tensor {name!r} has {n_dims} dims (1..4 allowed)")
            ne = tuple(
                np.frombuffer(cur.take(8 * n_dims, f"shape of {name!r}"), "<i8").tolist()
            )
            code = cur.u32(f"type of tensor {name!r}")
            try:
                gtype = GGMLType(code)
            except ValueError:
                raise GGUFTensorError(f"{path}: tensor {name!r} has unknown type {code}") from None
            rel = cur.u64(f"offset of tensor {name!r}")
            infos.append((name, ne, gtype, rel))

        self.data_offset = -(-cur.pos // align) * align
        self.file_size = cur.size
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, gtype, rel in infos:
            self.tensors[name] = self._check_tensor(name, ne, gtype, rel)

    def _check_tensor(self, name, ne, gtype, rel) -> TensorInfo:
        path = self.path
        if any(d <= 0 for d in ne):
            raise GGUFTensorError(f"{path}: tensor {name!r} has a non-positive dimension {ne}")
        block, bsize = BLOCK_SIZES[gtype]
        if ne[0] % block:
            raise GGUFTensorError(
                f"{path}: tensor {name!r} row length {ne[0]} is not a multiple of "
                f"{gtype.name}'s block size {block}"
            )
        n = 1
        for d in ne:
            n *= d
            if n > self.file_size * block:  # cannot possibly fit; also stops overflow
                raise GGUFBoundsError(f"{path}: tensor {name!r} shape {ne} exceeds the file")
        nbytes = n // block * bsize
        if rel % self.alignment:
            raise GGUFTensorError(
                f"{path}: tensor {name!r} offset {rel} is not aligned to {self.alignment}"
            )
        start = self.data_offset + rel
        if start + nbytes > self.file_size:
            raise GGUFBoundsError(
                f"{path}: tensor {name!r} data [{start}, {start + nbytes}) extends past the "
                f"end of the file ({self.file_size} bytes)"
            )
        if name in self.tensors:
            raise GGUFTensorError(f"{path}: tensor name {name!r} appears twice")
        return TensorInfo(name, tuple(ne), gtype, start, nbytes)

    # -- access ------------------------------------------------------------------

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def raw(self, name: str) -> np.ndarray:
        """Zero-copy uint8 view of a tensor's bytes, shaped [*outer dims, row bytes]."""
        info = self.tensors[name]
        block, bsize = BLOCK_SIZES[info.ggml_type]
        row_bytes = info.ne[0] // block * bsize
        arr = np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return arr.reshape(*info.shape[:-1], row_bytes)

    def close(self) -> None:
        mm = getattr(self, "_mmap", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views are still alive; the map closes when they go

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"GGUFFile({str(self.path)!r}, version={self.version}, "
            f"arch={self.architecture!r}, tensors={len(self.tensors)})"
        )


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    return GGUFFile(path)
