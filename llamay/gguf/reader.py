"""GGUF reader: mmap the file, parse header, metadata and tensor infos, hand out
zero-copy numpy views of tensor data.

Every count, length and offset read from the file is checked against the bytes
that remain before anything is allocated from it, so a corrupt file raises a
specific `GGUFError` naming the field instead of a MemoryError or a crash. Counts
of Python objects a few bytes of file can each create (tensors, metadata entries,
strings and arrays in arrays) are also capped (`MAX_TENSORS`, `MAX_METADATA`,
`MAX_ARRAY_ITEMS`: far above real models, whose largest arrays are ~0.5M merges),
so a large file of tiny items cannot turn into many times its size in memory:

- `GGUFMagicError`, `GGUFVersionError`: not a (little-endian, v2/v3) GGUF file;
- `GGUFTruncatedError`: the file ends inside a field;
- `GGUFBoundsError`: a count, length, shape or offset reaches past the end of the file;
- `GGUFValueTypeError`: an undefined metadata value type (or a wrongly typed
  `general.alignment`);
- `GGUFTensorError`: a bad tensor description (dims, type, alignment, overlap);
- `GGUFDuplicateError`: a metadata key or tensor name given twice.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llamay.errors import (
    GGUFBoundsError,
    GGUFDuplicateError,
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
    SCALAR_STRUCTS,
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
# Smallest encoding of one element of an array of arrays: element type (4), count (8).
_MIN_ARRAY_BYTES = 12
# Arrays of arrays nest at most this deep (GGUF files in the wild use one level).
_MAX_ARRAY_DEPTH = 8
# String arrays at least this long take the bulk decoding path.
_BULK_STRINGS = 64
MAX_TENSORS = 1 << 20
MAX_METADATA = 1 << 16
MAX_ARRAY_ITEMS = 1 << 21  # of an array of strings or of arrays

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALARS = SCALAR_STRUCTS

# Type of a metadata value: (value type, element type of an array or None).
MetadataType = tuple[GGUFValueType, GGUFValueType | None]


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


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        # Some vocabularies carry a few invalid byte strings; keep them readable.
        # (`GGUFFile.raw_metadata` and `copy_gguf` keep the original bytes.)
        return raw.decode("utf-8", errors="replace")


class _Cursor:
    """Bounds-checked little-endian reads from the mapped file."""

    def __init__(self, buf: mmap.mmap, path: str):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)
        self.path = path

    def remaining(self) -> int:
        return self.size - self.pos

    def _short(self, n: int, what: str) -> GGUFTruncatedError:
        return GGUFTruncatedError(
            f"{self.path}: file ends while reading {what} "
            f"(need {n} bytes at offset {self.pos}, file has {self.size})"
        )

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise self._short(n, what)
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self, what: str) -> int:
        if self.size - self.pos < 4:
            raise self._short(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        if self.size - self.pos < 8:
            raise self._short(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def count(self, what: str, min_item_bytes: int, limit: int | None = None) -> int:
        """A u64 element count, checked against the bytes left in the file (and `limit`)."""
        n = self.u64(what)
        if limit is not None and n > limit:
            raise GGUFBoundsError(f"{self.path}: {what} is {n}, over the limit of {limit}")
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
        nbytes = n * dtype.itemsize
        if nbytes > self.remaining():
            raise self._short(nbytes, what)
        arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=self.pos).copy()
        self.pos += nbytes
        return arr

    def strings(self, n: int, what: str) -> list[str]:
        """`n` length-prefixed strings (`n` already checked against the bytes left)."""
        if n >= _BULK_STRINGS:
            out = self._strings_bulk(n)
            if out is not None:
                return out
        out = []
        for i in range(n):
            out.append(self.string(f"{what}[{i}]"))
        return out

    def _strings_bulk(self, n: int) -> list[str] | None:
        """Fast path for long string arrays (vocabularies, merges).

        Find where each length prefix starts (vectorised, else one Python pass),
        zero the prefixes in a copy of the region, decode the whole region at
        once and split it at the 8-zero-byte prefixes. Returns None (the caller
        then takes the per-string path, which also reports errors precisely)
        when the strings contain NUL bytes, are not valid UTF-8, are 64 KiB or
        longer, or run past the end of the file.
        """
        found = self._prefixes_vectorised(n) or self._prefixes_loop(n)
        if found is None:
            return None
        prefix, end = found
        region = np.frombuffer(self.buf, dtype=np.uint8, count=end, offset=self.pos).copy()
        region[prefix] = 0  # length bytes 2..7 are zero already (length < 64 KiB)
        region[prefix + 1] = 0
        blob = region.tobytes()
        del region
        if blob.count(0) != 8 * n:  # a NUL inside some string: the split would be ambiguous
            return None
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError:
            return None
        parts = text.split("\0" * 8)
        if len(parts) != n + 1:  # cannot happen given the checks above
            return None
        self.pos += end
        del parts[0]
        return parts

    def _prefixes_vectorised(self, n: int) -> tuple[np.ndarray, int] | None:
        """Offsets (relative to `pos`) of `n` consecutive length prefixes and the end
        of the last string, found without a Python loop, or None.

        With no NUL bytes inside the strings and every length < 64 KiB, each
        prefix ends a run of zero bytes, so the prefixes are the first `n` ends
        of zero runs (minus 7). The result is accepted only if the lengths read
        at those offsets chain exactly from one prefix to the next.
        """
        avail = self.remaining()
        window = min(avail, 32 * n)
        while True:
            a = np.frombuffer(self.buf, dtype=np.uint8, count=window, offset=self.pos)
            z = a == 0
            run_ends = np.flatnonzero(z[:-1] & ~z[1:])
            if len(run_ends) >= n:
                break
            if window == avail:
                return None
            window = min(avail, 4 * window)
        prefix = run_ends[:n] - 7
        if prefix[0] != 0:  # (so all are >= 0: run ends increase)
            return None
        if (a[prefix + 2] | a[prefix + 3] | a[prefix + 4] | a[prefix + 5] | a[prefix + 6]).any():
            return None
        length = a[prefix].astype(np.int64)
        length |= a[prefix + 1].astype(np.int64) << 8
        nxt = prefix + 8 + length
        if (nxt[:-1] != prefix[1:]).any():
            return None
        end = int(nxt[-1])
        return (prefix, end) if end <= avail else None

    def _prefixes_loop(self, n: int) -> tuple[np.ndarray, int] | None:
        """As `_prefixes_vectorised`, by one Python pass over the lengths."""
        buf, start = self.buf, self.pos
        unpack = _U64.unpack_from
        ends = [0] * n
        pos = start
        try:
            for i in range(n):
                pos += 8 + unpack(buf, pos)[0]
                ends[i] = pos
        except (struct.error, OverflowError):
            return None
        if pos > self.size:
            return None
        e = np.array(ends, dtype=np.int64)
        e -= start
        prefix = np.empty_like(e)
        prefix[0] = 0
        prefix[1:] = e[:-1]
        if int((e - prefix).max()) >= 8 + 65536:
            return None
        return prefix, pos - start


def _value_type(code: int, what: str, path: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise GGUFValueTypeError(f"{path}: {what} has unknown value type {code}") from None


def _read_value(cur: _Cursor, vtype: GGUFValueType, what: str, depth: int = 0) -> Any:
    """One value of type `vtype` (scalars as Python objects, numeric arrays as numpy)."""
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        if cur.remaining() < scalar.size:
            raise cur._short(scalar.size, what)
        (v,) = scalar.unpack_from(cur.buf, cur.pos)
        cur.pos += scalar.size
        return v
    if vtype == GGUFValueType.STRING:
        return cur.string(what)
    # ARRAY
    if depth >= _MAX_ARRAY_DEPTH:
        raise GGUFValueTypeError(
            f"{cur.path}: {what} nests arrays more than {_MAX_ARRAY_DEPTH} deep"
        )
    etype = _value_type(cur.u32(f"element type of {what}"), what, cur.path)
    if etype in VALUE_DTYPES:
        dtype = VALUE_DTYPES[etype]
        n = cur.count(f"length of {what}", dtype.itemsize)
        arr = cur.array(dtype, n, what)
        return arr.astype(bool) if etype == GGUFValueType.BOOL else arr
    if etype == GGUFValueType.STRING:
        n = cur.count(f"length of {what}", 8, MAX_ARRAY_ITEMS)
        return cur.strings(n, what)
    n = cur.count(f"length of {what}", _MIN_ARRAY_BYTES, MAX_ARRAY_ITEMS)
    return [_read_value(cur, etype, f"{what}[{i}]", depth + 1) for i in range(n)]


class GGUFFile:
    """An open GGUF file. Tensor data stays in the mmap; `raw()` returns views of it.

    Attributes: `version`, `metadata` (key -> value: int/float/bool/str scalars,
    numpy arrays for numeric arrays, lists of str for string arrays, lists for
    arrays of arrays), `metadata_types` (key -> (value type, array element type or
    None)), `alignment`, `data_offset`, `file_size`, `tensors` (name -> TensorInfo,
    in file order).

    Use as a context manager, or call `close()`; views handed out keep the map alive.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise GGUFTruncatedError(f"{self.path}: file is empty")
            self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(self._mmap)
        except BaseException:
            self.close()
            raise

    # -- parsing ---------------------------------------------------------------

    def _parse(self, buf: mmap.mmap) -> None:
        path = str(self.path)
        cur = _Cursor(buf, path)
        magic = buf[:4]
        if len(magic) < 4 and GGUF_MAGIC.startswith(magic):
            raise GGUFTruncatedError(f"{path}: file ends inside the magic ({len(magic)} bytes)")
        cur.pos = 4
        if magic != GGUF_MAGIC:
            raise GGUFMagicError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        self.version = cur.u32("version")
        if self.version not in GGUF_VERSIONS:
            if self.version & 0xFFFF == 0 and (self.version >> 24) in GGUF_VERSIONS:
                raise GGUFVersionError(
                    f"{path}: a big-endian GGUF file; llamay reads little-endian GGUF only "
                    "(convert it with llama.cpp's gguf tools)"
                )
            raise GGUFVersionError(
                f"{path}: GGUF version {self.version} is not supported (llamay reads 2 and 3)"
            )
        n_tensors = cur.count("tensor count", _MIN_TENSOR_INFO_BYTES, MAX_TENSORS)
        n_kv = cur.count("metadata count", _MIN_KV_BYTES, MAX_METADATA)
        if n_tensors * _MIN_TENSOR_INFO_BYTES + n_kv * _MIN_KV_BYTES > cur.remaining():
            raise GGUFBoundsError(
                f"{path}: {n_tensors} tensors and {n_kv} metadata entries cannot fit in "
                f"the {cur.remaining()} bytes that remain"
            )

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, MetadataType] = {}
        self._kv_spans: dict[str, tuple[int, int]] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:
                raise GGUFDuplicateError(f"{path}: metadata key {key!r} appears twice")
            start = cur.pos
            vtype = _value_type(cur.u32(f"type of {key!r}"), f"metadata {key!r}", path)
            subtype = None
            if vtype == GGUFValueType.ARRAY and cur.remaining() >= 4:
                subtype = _value_type(_U32.unpack_from(buf, cur.pos)[0], f"metadata {key!r}", path)
            self.metadata[key] = _read_value(cur, vtype, f"metadata {key!r}")
            self.metadata_types[key] = (vtype, subtype)
            self._kv_spans[key] = (start, cur.pos)

        self.alignment = self._alignment(path)

        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = cur.string(f"tensor #{i} name")
            if name in names:
                raise GGUFDuplicateError(f"{path}: tensor name {name!r} appears twice")
            names.add(name)
            n_dims = cur.u32(f"n_dims of tensor {name!r}")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise GGUFTensorError(
                    f"{path}: tensor {name!r} has {n_dims} dims (1..{GGML_MAX_DIMS} allowed)"
                )
            ne = struct.unpack(f"<{n_dims}q", cur.take(8 * n_dims, f"shape of {name!r}"))
            code = cur.u32(f"type of tensor {name!r}")
            try:
                gtype = GGMLType(code)
            except ValueError:
                raise GGUFTensorError(
                    f"{path}: tensor {name!r} has unknown or unsupported GGML type {code}"
                ) from None
            rel = cur.u64(f"offset of tensor {name!r}")
            infos.append((name, ne, gtype, rel))

        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.file_size = cur.size
        self.tensors: dict[str, TensorInfo] = {}
        for name, ne, gtype, rel in infos:
            self.tensors[name] = self._check_tensor(name, ne, gtype, rel)
        self._check_overlap(path)

    def _alignment(self, path: str) -> int:
        key = "general.alignment"
        if key not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        if self.metadata_types[key][0] != GGUFValueType.UINT32:
            raise GGUFValueTypeError(
                f"{path}: {key} has type {self.metadata_types[key][0].name}, expected UINT32"
            )
        align = self.metadata[key]
        if align <= 0 or align & (align - 1):
            raise GGUFTensorError(f"{path}: {key} {align} is not a power of two")
        return align

    def _check_tensor(self, name: str, ne: tuple[int, ...], gtype: GGMLType, rel: int):
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
        return TensorInfo(name, tuple(ne), gtype, start, nbytes)

    def _check_overlap(self, path: str) -> None:
        prev = None
        for info in sorted(self.tensors.values(), key=lambda t: t.offset):
            if prev is not None and info.offset < prev.offset + prev.nbytes:
                raise GGUFTensorError(
                    f"{path}: data of tensors {prev.name!r} and {info.name!r} overlap "
                    f"(at bytes {info.offset}..{prev.offset + prev.nbytes})"
                )
            prev = info

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

    def raw_metadata(self, key: str) -> bytes:
        """The encoded value of a metadata entry exactly as stored: the u32 value
        type followed by the value (used to copy entries byte for byte)."""
        start, end = self._kv_spans[key]
        return self._mmap[start:end]

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
