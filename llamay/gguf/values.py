"""GGUF metadata values: the type a Python value is written as (`infer_type`, the table
in `llamay.gguf.writer`'s docstring) and its bytes (`encode_value`, the same bytes
`GGUFFile.raw_metadata` returns for a stored entry)."""

from __future__ import annotations

import operator
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from llamay.errors import GGUFWriteError
from llamay.gguf.constants import SCALAR_STRUCTS, VALUE_DTYPES, GGMLType, GGUFValueType

TypeSpec = GGUFValueType | tuple[GGUFValueType, GGUFValueType | None]

U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
_SCALAR_STRUCTS = SCALAR_STRUCTS
_INT_TYPES = {
    GGUFValueType.UINT8,
    GGUFValueType.INT8,
    GGUFValueType.UINT16,
    GGUFValueType.INT16,
    GGUFValueType.UINT32,
    GGUFValueType.INT32,
    GGUFValueType.UINT64,
    GGUFValueType.INT64,
}
_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}
# numpy dtype (native or little-endian) -> GGUF value type
_DTYPE_TYPES: dict[np.dtype, GGUFValueType] = {
    np.dtype(np.bool_): GGUFValueType.BOOL,
    **{dt: t for t, dt in VALUE_DTYPES.items() if t != GGUFValueType.BOOL},
}
# numpy dtype -> GGML tensor type, for tensors given as typed arrays
DTYPE_GGML: dict[np.dtype, GGMLType] = {
    np.dtype("<f4"): GGMLType.F32,
    np.dtype("<f2"): GGMLType.F16,
    np.dtype("<f8"): GGMLType.F64,
    np.dtype("i1"): GGMLType.I8,
    np.dtype("<i2"): GGMLType.I16,
    np.dtype("<i4"): GGMLType.I32,
    np.dtype("<i8"): GGMLType.I64,
}


def pad_to(n: int, align: int) -> int:
    return -(-n // align) * align


# -- metadata encoding -----------------------------------------------------------


def _norm_type(vtype: TypeSpec, what: str) -> tuple[GGUFValueType, GGUFValueType | None]:
    try:
        if isinstance(vtype, tuple):
            outer, sub = vtype
            outer = GGUFValueType(outer)
            if outer != GGUFValueType.ARRAY:
                return outer, None
            return outer, (GGUFValueType(sub) if sub is not None else None)
        return GGUFValueType(vtype), None
    except (ValueError, TypeError):
        raise GGUFWriteError(
            f"{what}: {vtype!r} is not a GGUF value type or (ARRAY, element type)"
        ) from None


def _int_type_for(lo: int, hi: int, what: str) -> GGUFValueType:
    if -(2**31) <= lo and hi < 2**31:
        return GGUFValueType.INT32
    if -(2**63) <= lo and hi < 2**63:
        return GGUFValueType.INT64
    if 0 <= lo and hi < 2**64:
        return GGUFValueType.UINT64
    raise GGUFWriteError(f"{what}: integer {hi if hi >= 2**63 else lo} does not fit 64 bits")


def is_int(v: Any) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool | np.bool_)


def _is_seq(v: Any) -> bool:
    return isinstance(v, list | tuple | np.ndarray)


def infer_type(value: Any, what: str = "value") -> tuple[GGUFValueType, GGUFValueType | None]:
    """The GGUF type `value` gets when none is given (see the module docstring)."""
    if isinstance(value, bool | np.bool_):
        return GGUFValueType.BOOL, None
    if isinstance(value, np.generic) and value.dtype in _DTYPE_TYPES:
        return _DTYPE_TYPES[value.dtype], None
    if isinstance(value, int):
        return _int_type_for(value, value, what), None
    if isinstance(value, float):
        return GGUFValueType.FLOAT32, None
    if isinstance(value, str | bytes | bytearray):
        return GGUFValueType.STRING, None
    if _is_seq(value):
        return GGUFValueType.ARRAY, _infer_element_type(value, what)
    raise GGUFWriteError(
        f"{what}: cannot store a {type(value).__name__} in GGUF metadata "
        "(use bool, int, float, str, bytes, a 1-D numpy array or a list of those)"
    )


def _infer_element_type(value: Any, what: str) -> GGUFValueType:
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise GGUFWriteError(f"{what}: arrays must be 1-D (got shape {value.shape})")
        dt = value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype
        if dt in _DTYPE_TYPES:
            return _DTYPE_TYPES[dt]
        if dt.kind in "US":
            return GGUFValueType.STRING
        if dt.kind != "O":
            raise GGUFWriteError(f"{what}: numpy dtype {value.dtype} is not a GGUF type")
        value = value.tolist()
    if len(value) == 0:
        return GGUFValueType.STRING
    kinds = set()
    for v in value:
        if isinstance(v, bool | np.bool_):
            kinds.add("bool")
        elif is_int(v):
            kinds.add("int")
        elif isinstance(v, float | np.floating):
            kinds.add("float")
        elif isinstance(v, str | bytes | bytearray):
            kinds.add("str")
        elif _is_seq(v):
            kinds.add("seq")
        else:
            raise GGUFWriteError(f"{what}: cannot store a {type(v).__name__} in a GGUF array")
    if kinds == {"int", "float"}:
        kinds = {"float"}
    if len(kinds) != 1:
        raise GGUFWriteError(f"{what}: array mixes element kinds {sorted(kinds)}")
    kind = kinds.pop()
    if kind == "bool":
        return GGUFValueType.BOOL
    if kind == "str":
        return GGUFValueType.STRING
    if kind == "seq":
        return GGUFValueType.ARRAY
    if kind == "float":
        dts = {v.dtype for v in value if isinstance(v, np.floating)}
        if len(dts) == 1 and len(value) == sum(isinstance(v, np.floating) for v in value):
            dt = dts.pop()
            if dt in _DTYPE_TYPES:
                return _DTYPE_TYPES[dt]
        return GGUFValueType.FLOAT32
    dts = {v.dtype for v in value if isinstance(v, np.integer)}
    if len(dts) == 1 and all(isinstance(v, np.integer) for v in value):
        return _DTYPE_TYPES[dts.pop().newbyteorder("<")]
    ints = [int(v) for v in value]
    return _int_type_for(min(ints), max(ints), what)


def encode_string(value: Any, what: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as e:
            raise GGUFWriteError(f"{what}: string cannot be encoded as UTF-8 ({e})") from None
    if isinstance(value, bytes | bytearray | np.bytes_):
        return bytes(value)
    raise GGUFWriteError(
        f"{what}: expected a str or bytes for a STRING, got {type(value).__name__}"
    )


def _scalar_bytes(value: Any, vtype: GGUFValueType, what: str) -> bytes:
    if vtype == GGUFValueType.BOOL:
        if isinstance(value, bool | np.bool_) or (is_int(value) and int(value) in (0, 1)):
            return b"\x01" if value else b"\x00"
        raise GGUFWriteError(f"{what}: {value!r} is not a bool")
    st = _SCALAR_STRUCTS[vtype]
    if vtype in _INT_TYPES:
        if not is_int(value):
            raise GGUFWriteError(f"{what}: {value!r} is not an integer (type {vtype.name})")
        try:
            return st.pack(operator.index(value))
        except struct.error:
            raise GGUFWriteError(f"{what}: {value} does not fit {vtype.name}") from None
    if not isinstance(value, int | float | np.integer | np.floating) or isinstance(
        value, bool | np.bool_
    ):
        raise GGUFWriteError(f"{what}: {value!r} is not a number (type {vtype.name})")
    try:
        return st.pack(float(value))
    except (OverflowError, struct.error):
        raise GGUFWriteError(f"{what}: {value} does not fit {vtype.name}") from None


def _numeric_array(value: Any, etype: GGUFValueType, what: str) -> np.ndarray:
    """`value` as a little-endian array of `etype`'s dtype, checking every element fits."""
    dtype = VALUE_DTYPES[etype]
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise GGUFWriteError(f"{what}: arrays must be 1-D (got shape {value.shape})")
        arr = value
        if arr.dtype.kind == "O":
            arr = None
            value = value.tolist()
    else:
        arr = None
    if arr is None:
        items = list(value)
        if etype == GGUFValueType.BOOL:
            ok = all(isinstance(v, bool | np.bool_) or (is_int(v) and v in (0, 1)) for v in items)
        elif etype in _INT_TYPES:
            ok = all(is_int(v) for v in items)
        else:
            ok = all(
                isinstance(v, int | float | np.integer | np.floating)
                and not isinstance(v, bool | np.bool_)
                for v in items
            )
        if not ok:
            raise GGUFWriteError(f"{what}: elements are not all of kind {etype.name}")
        if etype in _INT_TYPES:
            info = np.iinfo(dtype)
            if items and (min(items) < info.min or max(items) > info.max):
                raise GGUFWriteError(f"{what}: elements do not fit {etype.name}")
            return np.array([int(v) for v in items], dtype=dtype)
        if etype == GGUFValueType.BOOL:
            return np.array([bool(v) for v in items], dtype=np.uint8)
        src = np.array([float(v) for v in items], dtype=np.float64)
    else:
        src = arr
    kind = src.dtype.kind
    if etype == GGUFValueType.BOOL:
        if kind == "b":
            return src.astype(np.uint8)
        if kind in "iu" and ((src == 0) | (src == 1)).all():
            return src.astype(np.uint8)
        raise GGUFWriteError(f"{what}: elements are not all bools")
    if etype in _INT_TYPES:
        if kind not in "iub":
            raise GGUFWriteError(f"{what}: {src.dtype} elements are not integers ({etype.name})")
        info = np.iinfo(dtype)
        if src.size and (int(src.min()) < info.min or int(src.max()) > info.max):
            raise GGUFWriteError(f"{what}: elements do not fit {etype.name}")
        return src.astype(dtype)
    if kind not in "iuf":
        raise GGUFWriteError(f"{what}: {src.dtype} elements are not numbers ({etype.name})")
    with np.errstate(over="ignore"):
        out = src.astype(dtype)
    if kind == "f" and (np.isinf(out) & np.isfinite(src)).any():
        raise GGUFWriteError(f"{what}: elements overflow {etype.name}")
    return out


def _string_array_bytes(items: Iterable[Any], what: str) -> bytes:
    enc = [encode_string(v, what) for v in items]
    parts: list[bytes] = [b""] * (2 * len(enc))
    parts[0::2] = [U64.pack(len(e)) for e in enc]
    parts[1::2] = enc
    return b"".join(parts)


def _encode(
    value: Any, vtype: GGUFValueType, subtype: GGUFValueType | None, what: str, depth: int = 0
) -> bytes:
    """The payload of `value` as type `vtype` (without the leading type code)."""
    if vtype in _SCALAR_STRUCTS or vtype == GGUFValueType.BOOL:
        return _scalar_bytes(value, vtype, what)
    if vtype == GGUFValueType.STRING:
        s = encode_string(value, what)
        return U64.pack(len(s)) + s
    if vtype != GGUFValueType.ARRAY:  # pragma: no cover (IntEnum covers all)
        raise GGUFWriteError(f"{what}: unknown type {vtype!r}")
    if depth >= 8:
        raise GGUFWriteError(f"{what}: arrays nest more than 8 deep")
    if not _is_seq(value):
        raise GGUFWriteError(f"{what}: expected a list, tuple or 1-D array for an ARRAY")
    if subtype is None:
        subtype = _infer_element_type(value, what)
    head = U32.pack(subtype) + U64.pack(len(value))
    if subtype in VALUE_DTYPES:
        return head + _numeric_array(value, subtype, what).tobytes()
    if subtype == GGUFValueType.STRING:
        items = value.tolist() if isinstance(value, np.ndarray) else value
        return head + _string_array_bytes(items, what)
    if subtype == GGUFValueType.ARRAY:
        return head + b"".join(
            _encode(v, GGUFValueType.ARRAY, None, f"{what}[{i}]", depth + 1)
            for i, v in enumerate(value)
        )
    raise GGUFWriteError(f"{what}: {subtype!r} is not a GGUF element type")  # pragma: no cover


def encode_value(value: Any, vtype: TypeSpec | None = None, what: str = "value") -> bytes:
    """`value` encoded as a GGUF metadata value: u32 type code, then the payload.

    The same bytes `GGUFFile.raw_metadata` returns for a stored entry.
    """
    if vtype is None:
        t, sub = infer_type(value, what)
    else:
        t, sub = _norm_type(vtype, what)
    return U32.pack(t) + _encode(value, t, sub, what)
