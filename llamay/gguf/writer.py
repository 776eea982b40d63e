"""GGUF v3 writer: typed metadata, tensors streamed to disk, atomic replace.

    w = GGUFWriter("out.gguf")
    w.add("general.architecture", "llama")
    w.add("llama.context_length", 2048, GGUFValueType.UINT32)
    w.add_tensor("token_embd.weight", f.raw("token_embd.weight"), GGMLType.Q8_0)
    w.write()

or in one call `write_gguf(path, metadata, tensors, types=...)`, and
`copy_gguf(src, dst, metadata={...}, tensors={...})` to rewrite a file with some
entries changed (unchanged entries are copied byte for byte).

Metadata types are inferred from the values unless given:

| value                               | GGUF type                                   |
|-------------------------------------|---------------------------------------------|
| bool, numpy bool                    | BOOL                                        |
| int                                 | INT32, else INT64, else UINT64 (by range)   |
| float                               | FLOAT32 (as gguf-py; pass FLOAT64 to keep)  |
| numpy scalar                        | its dtype (float16 is not a GGUF type)      |
| str, bytes                          | STRING (str is UTF-8 encoded; lone          |
|                                     | surrogates from `surrogateescape` decoding  |
|                                     | become their original bytes)                |
| 1-D numpy array                     | ARRAY of its dtype                          |
| list / tuple                        | ARRAY of the common element type (ints      |
|                                     | widen by range; ints mixed with floats give |
|                                     | FLOAT32); lists of lists: ARRAY of ARRAY    |
| empty list / tuple                  | ARRAY of STRING                             |

A type is a `GGUFValueType`, or `(GGUFValueType.ARRAY, element type)` as in
`GGUFFile.metadata_types`, so `write_gguf(p, f.metadata, ..., types=f.metadata_types)`
preserves every type (one corner aside: inside an array of arrays, an empty inner
list reads back as [] and is written as an empty STRING array). Values are
range-checked against an explicit type.

Tensors are `TensorSpec(name, ne, ggml_type, data)` or tuples of the same; `ne`
is ggml's order (use `TensorSpec.from_shape` for numpy's order) and `data` is
any buffer (bytes, numpy array, mmap view) or a callable returning one, called
only when that tensor is written. Data are laid out in the order given, each
at a multiple of the alignment and padded with zeros, as gguf-py and llama.cpp do.
"""

from __future__ import annotations

import mmap
import operator
import os
import secrets
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from llamay.errors import GGUFDuplicateError, GGUFWriteError
from llamay.gguf.constants import (
    BLOCK_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLType,
    GGUFValueType,
)
from llamay.gguf.reader import GGML_MAX_DIMS, GGUFFile
from llamay.gguf.values import (
    DTYPE_GGML,
    U32,
    U64,
    TypeSpec,
    encode_string,
    encode_value,
    is_int,
    pad_to,
)

GGUF_WRITE_VERSION = 3
ALIGNMENT_KEY = "general.alignment"

Buffer = bytes | bytearray | memoryview | np.ndarray | mmap.mmap
TensorData = Buffer | Callable[[], Buffer]


# -- tensors -----------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: `ne` in ggml's order (ne[0] is the row length)."""

    name: str
    ne: tuple[int, ...]
    ggml_type: GGMLType
    data: TensorData

    @staticmethod
    def from_shape(
        name: str, shape: Iterable[int], ggml_type: GGMLType | int, data: TensorData
    ) -> TensorSpec:
        """A spec from a numpy-order shape (the reverse of `ne`)."""
        return TensorSpec(name, tuple(reversed(tuple(shape))), GGMLType(ggml_type), data)

    @property
    def nbytes(self) -> int:
        block, size = BLOCK_SIZES[self.ggml_type]
        n = 1
        for d in self.ne:
            n *= d
        return n // block * size


def tensor_spec(
    name: str,
    data: TensorData,
    ggml_type: GGMLType | int | None = None,
    *,
    ne: Iterable[int] | None = None,
    shape: Iterable[int] | None = None,
) -> TensorSpec:
    """A `TensorSpec` with whatever is not given inferred from `data`.

    Type from a float/int array's dtype (F32, F16, F64, I8..I64). Shape from the
    array: an element-typed array's own shape, or for a uint8 array of packed
    blocks shaped [..., row bytes] (as `GGUFFile.raw` returns) the row length in
    elements. Give `ne` (ggml order) or `shape` (numpy order) otherwise.
    """
    if ne is not None and shape is not None:
        raise GGUFWriteError(f"tensor {name!r}: give ne or shape, not both")
    arr = data if isinstance(data, np.ndarray) else None
    if ggml_type is None:
        dt = None if arr is None else arr.dtype
        if dt is not None and dt.byteorder == ">":
            dt = dt.newbyteorder("<")
        if dt not in DTYPE_GGML:
            raise GGUFWriteError(
                f"tensor {name!r}: give ggml_type (cannot infer it from "
                f"{arr.dtype if arr is not None else type(data).__name__})"
            )
        ggml_type = DTYPE_GGML[dt]
    try:
        gtype = GGMLType(ggml_type)
    except ValueError:
        raise GGUFWriteError(f"tensor {name!r}: unknown GGML type {ggml_type!r}") from None
    if shape is not None:
        ne = tuple(reversed(tuple(shape)))
    if ne is None:
        if arr is None:
            raise GGUFWriteError(f"tensor {name!r}: give ne or shape for non-array data")
        block, size = BLOCK_SIZES[gtype]
        if arr.ndim == 0:
            raise GGUFWriteError(f"tensor {name!r}: a 0-d array has no shape to write")
        if block == 1 and arr.dtype.itemsize == size:
            ne = tuple(reversed(arr.shape))
        elif arr.dtype == np.uint8:
            if arr.shape[-1] % size:
                raise GGUFWriteError(
                    f"tensor {name!r}: rows of {arr.shape[-1]} bytes are not whole "
                    f"{gtype.name} blocks of {size} bytes"
                )
            ne = (arr.shape[-1] // size * block, *reversed(arr.shape[:-1]))
        else:
            raise GGUFWriteError(
                f"tensor {name!r}: cannot infer the {gtype.name} shape of a {arr.dtype} array"
            )
    return TensorSpec(name, tuple(int(d) for d in ne), gtype, data)


def _as_spec(t: TensorSpec | tuple) -> TensorSpec:
    if isinstance(t, TensorSpec):
        return t
    if isinstance(t, tuple) and len(t) == 4:
        name, ne, gtype, data = t
        return tensor_spec(name, data, gtype, ne=ne)
    raise GGUFWriteError(f"a tensor must be a TensorSpec or (name, ne, ggml_type, data): {t!r}")


def _check_spec(t: TensorSpec) -> None:
    if not isinstance(t.name, str) or not t.name:
        raise GGUFWriteError(f"tensor name {t.name!r} must be a non-empty str")
    if not 1 <= len(t.ne) <= GGML_MAX_DIMS:
        raise GGUFWriteError(f"tensor {t.name!r}: {len(t.ne)} dims (1..{GGML_MAX_DIMS} allowed)")
    if any(not is_int(d) or d <= 0 or d >= 2**63 for d in t.ne):
        raise GGUFWriteError(f"tensor {t.name!r}: dims {t.ne} must be positive int64s")
    block, _ = BLOCK_SIZES[t.ggml_type]
    if t.ne[0] % block:
        raise GGUFWriteError(
            f"tensor {t.name!r}: row length {t.ne[0]} is not a multiple of "
            f"{t.ggml_type.name}'s block size {block}"
        )


def _byte_view(data: Buffer, name: str) -> memoryview:
    if isinstance(data, np.ndarray):
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        data = np.ascontiguousarray(data)
        return memoryview(data.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(data)
    except TypeError:
        raise GGUFWriteError(
            f"tensor {name!r}: data of type {type(data).__name__} is not a buffer"
        ) from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


# -- the writer ----------------------------------------------------------------------


class GGUFWriter:
    """Collects metadata (encoded as added) and tensor specs; `write()` streams the
    file to a temporary name beside `path` and renames it into place."""

    def __init__(self, path: str | os.PathLike, *, alignment: int | None = None):
        self.path = Path(path)
        if alignment is not None and (
            not is_int(alignment) or alignment <= 0 or alignment & (alignment - 1)
        ):
            raise GGUFWriteError(f"alignment {alignment!r} is not a power of two")
        self._alignment = alignment
        self._kv: dict[str, bytes] = {}
        self._tensors: dict[str, TensorSpec] = {}

    def add(self, key: str, value: Any, vtype: TypeSpec | None = None) -> None:
        """Add a metadata entry; its type is inferred from `value` unless given."""
        self._check_key(key)
        self._kv[key] = encode_value(value, vtype, f"metadata {key!r}")

    def add_raw(self, key: str, encoded: bytes) -> None:
        """Add a metadata entry already encoded (u32 type code + payload), e.g. the
        bytes of `GGUFFile.raw_metadata`."""
        self._check_key(key)
        if len(encoded) < 5:
            raise GGUFWriteError(f"metadata {key!r}: {len(encoded)} bytes is no encoded value")
        self._kv[key] = bytes(encoded)

    def _check_key(self, key: str) -> None:
        if not isinstance(key, str):
            raise GGUFWriteError(f"metadata key {key!r} must be a str")
        if key in self._kv:
            raise GGUFDuplicateError(f"metadata key {key!r} added twice")

    def add_tensor(
        self,
        name: str | TensorSpec,
        data: TensorData | None = None,
        ggml_type: GGMLType | int | None = None,
        *,
        ne: Iterable[int] | None = None,
        shape: Iterable[int] | None = None,
    ) -> None:
        """Add a tensor (a `TensorSpec`, or its parts; see `tensor_spec`)."""
        if isinstance(name, TensorSpec):
            spec = name
        else:
            if data is None:
                raise GGUFWriteError(f"tensor {name!r}: no data")
            spec = tensor_spec(name, data, ggml_type, ne=ne, shape=shape)
        try:
            spec = replace(
                spec,
                ggml_type=GGMLType(spec.ggml_type),
                ne=tuple(operator.index(d) for d in spec.ne),
            )
        except (ValueError, TypeError):
            raise GGUFWriteError(
                f"tensor {spec.name!r}: bad GGML type {spec.ggml_type!r} or dims {spec.ne!r}"
            ) from None
        _check_spec(spec)
        if spec.name in self._tensors:
            raise GGUFDuplicateError(f"tensor name {spec.name!r} added twice")
        self._tensors[spec.name] = spec

    @property
    def alignment(self) -> int:
        raw = self._kv.get(ALIGNMENT_KEY)
        if raw is None:
            return self._alignment or GGUF_DEFAULT_ALIGNMENT
        if len(raw) != 8 or U32.unpack_from(raw)[0] != GGUFValueType.UINT32:
            raise GGUFWriteError(f"{ALIGNMENT_KEY} must be a UINT32 (readers reject others)")
        align = U32.unpack_from(raw, 4)[0]
        if align <= 0 or align & (align - 1):
            raise GGUFWriteError(f"{ALIGNMENT_KEY} {align} is not a power of two")
        if self._alignment is not None and self._alignment != align:
            raise GGUFWriteError(
                f"alignment {self._alignment} disagrees with metadata {ALIGNMENT_KEY} {align}"
            )
        return align

    def write(self, *, fsync: bool = True) -> Path:
        """Write the file: header, metadata and tensor infos, then each tensor's data
        (read from its buffer, or its callable, only now). Atomic: the file appears
        complete under `path` or not at all."""
        if (
            self._alignment is not None
            and self._alignment != GGUF_DEFAULT_ALIGNMENT
            and ALIGNMENT_KEY not in self._kv
        ):
            self.add(ALIGNMENT_KEY, self._alignment, GGUFValueType.UINT32)
        align = self.alignment
        specs = list(self._tensors.values())
        offsets = []
        off = 0
        for t in specs:
            offsets.append(off)
            off = pad_to(off + t.nbytes, align)

        path = self.path
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb", buffering=1 << 20) as f:
                pos = self._write_header(f, specs, offsets)
                data_start = pad_to(pos, align)
                f.write(b"\0" * (data_start - pos))
                for t in specs:
                    data = t.data() if callable(t.data) else t.data
                    mv = _byte_view(data, t.name)
                    if mv.nbytes != t.nbytes:
                        raise GGUFWriteError(
                            f"tensor {t.name!r}: {mv.nbytes} bytes of data, but "
                            f"{t.ggml_type.name} {list(t.ne)} takes {t.nbytes}"
                        )
                    f.write(mv)
                    del mv, data
                    f.write(b"\0" * (pad_to(t.nbytes, align) - t.nbytes))
                f.flush()
                if fsync:
                    os.fsync(f.fileno())
            os.replace(tmp, path)
            if fsync:
                _fsync_dir(path.parent)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return path

    def _write_header(self, f, specs: list[TensorSpec], offsets: list[int]) -> int:
        n = 0

        def put(b: bytes) -> None:
            nonlocal n
            f.write(b)
            n += len(b)

        put(GGUF_MAGIC + struct.pack("<IQQ", GGUF_WRITE_VERSION, len(specs), len(self._kv)))
        for key, enc in self._kv.items():
            k = encode_string(key, f"metadata key {key!r}")
            put(U64.pack(len(k)) + k)
            put(enc)
        for t, rel in zip(specs, offsets, strict=True):
            k = encode_string(t.name, f"tensor name {t.name!r}")
            info = U64.pack(len(k)) + k + U32.pack(len(t.ne))
            info += struct.pack(f"<{len(t.ne)}Q", *t.ne) + U32.pack(t.ggml_type) + U64.pack(rel)
            put(info)
        return n


def write_gguf(
    path: str | os.PathLike,
    metadata: Mapping[str, Any],
    tensors: Iterable[TensorSpec | tuple] = (),
    *,
    types: Mapping[str, TypeSpec] | None = None,
    alignment: int | None = None,
    fsync: bool = True,
) -> Path:
    """Write a GGUF v3 file of `metadata` (in order; types from `types` or inferred)
    and `tensors` (`TensorSpec`s or (name, ne, ggml_type, data) tuples)."""
    w = GGUFWriter(path, alignment=alignment)
    types = types or {}
    for key, value in metadata.items():
        w.add(key, value, types.get(key))
    for t in tensors:
        w.add_tensor(_as_spec(t))
    return w.write(fsync=fsync)


def copy_gguf(
    src: GGUFFile | str | os.PathLike,
    dst: str | os.PathLike,
    *,
    metadata: Mapping[str, Any] | None = None,
    types: Mapping[str, TypeSpec] | None = None,
    tensors: Mapping[str, TensorSpec | TensorData | None] | None = None,
    alignment: int | None = None,
    fsync: bool = True,
) -> Path:
    """Write `src` to `dst` with some metadata and tensors changed.

    `metadata`: key -> new value (replacing in place, or appended), or None to
    drop the key. A replaced value keeps the key's type in `src` unless `types`
    gives one. `tensors`: name -> None (drop), a `TensorSpec` (replace or append),
    or just data (same type and shape, or inferred for a new name; see
    `tensor_spec`). Everything else is copied byte for byte, so with no changes
    a file written by gguf-py or llama.cpp comes out identical. `dst` may be
    `src`'s own path: the new file replaces it atomically.
    """
    own = not isinstance(src, GGUFFile)
    f = GGUFFile(src) if own else src
    try:
        metadata = dict(metadata or {})
        types = dict(types or {})
        tensors = dict(tensors or {})
        w = GGUFWriter(dst)
        for key in f.metadata:
            if key in metadata:
                value = metadata.pop(key)
                if value is not None:
                    w.add(key, value, types.get(key, f.metadata_types[key]))
            else:
                w.add_raw(key, f.raw_metadata(key))
        for key, value in metadata.items():
            if value is not None:
                w.add(key, value, types.get(key))
        if alignment is not None:
            if ALIGNMENT_KEY in w._kv:
                del w._kv[ALIGNMENT_KEY]
            if alignment != GGUF_DEFAULT_ALIGNMENT:
                w.add(ALIGNMENT_KEY, alignment, GGUFValueType.UINT32)
        for name, info in f.tensors.items():
            if name in tensors:
                new = tensors.pop(name)
                if new is None:
                    continue
                if not isinstance(new, TensorSpec):
                    new = TensorSpec(name, info.ne, info.ggml_type, new)
                if new.name != name:
                    raise GGUFWriteError(f"tensor {name!r}: replacement is named {new.name!r}")
                w.add_tensor(new)
            else:
                w.add_tensor(TensorSpec(name, info.ne, info.ggml_type, _raw_getter(f, name)))
        for name, new in tensors.items():
            if new is None:
                continue
            w.add_tensor(new if isinstance(new, TensorSpec) else tensor_spec(name, new))
        return w.write(fsync=fsync)
    finally:
        if own:
            f.close()


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _raw_getter(f: GGUFFile, name: str) -> Callable[[], np.ndarray]:
    return lambda: f.raw(name)
