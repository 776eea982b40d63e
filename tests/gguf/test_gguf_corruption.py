"""Corrupt GGUF files must fail with the specific `GGUFError` subclass, never with
MemoryError, OverflowError, IndexError, UnicodeDecodeError, ValueError,
struct.error or a crash, and before allocating more than the file's size."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf_testlib import tiny_path
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from llamay.errors import (
    GGUFBoundsError,
    GGUFDuplicateError,
    GGUFError,
    GGUFMagicError,
    GGUFTensorError,
    GGUFTruncatedError,
    GGUFValueTypeError,
    GGUFVersionError,
)
from llamay.gguf import GGMLType, GGUFFile, GGUFWriter, TensorSpec
from llamay.gguf.constants import GGUFValueType as T

HYP = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _base_bytes() -> bytes:
    """A small GGUF with every structure the reader handles: scalars, a string array
    long enough for the bulk path, a numeric array, nested arrays, three tensors."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "base.gguf"
        w = GGUFWriter(path)
        w.add("general.architecture", "tiny")
        w.add("general.alignment", 32, T.UINT32)
        w.add("a.u32", 7, T.UINT32)
        w.add("a.f32", 0.5)
        w.add("a.bool", True)
        w.add("a.str", "héllo")
        w.add("a.tokens", [f"t{i}" if i % 7 else "" for i in range(70)])
        w.add("a.scores", np.linspace(0, 1, 70, dtype=np.float32))
        w.add("a.nested", [[1, 2], ["x", "yz"], []])
        rng = np.random.default_rng(1)
        w.add_tensor(TensorSpec.from_shape("w.q8", (2, 64), GGMLType.Q8_0, rng.bytes(2 * 2 * 34)))
        w.add_tensor("w.f32", rng.standard_normal((3, 4)).astype(np.float32))
        w.add_tensor("w.f16", np.ones(8, np.float16))
        w.write(fsync=False)
        return path.read_bytes()


BASE = _base_bytes()


def _layout(buf: bytes) -> list[tuple[str, int, int, str]]:
    """An independent walk of a well-formed GGUF: (kind, offset, size, label) of every
    header integer field."""
    fields = []
    pos = 0

    def field(kind, size, label=""):
        nonlocal pos
        fields.append((kind, pos, size, label))
        v = int.from_bytes(buf[pos : pos + size], "little")
        pos += size
        return v

    def value(vtype, label):
        nonlocal pos
        if vtype == 8:
            n = field("str_len", 8, label)
            pos += n
        elif vtype == 9:
            et = field("etype", 4, label)
            n = field("arr_len", 8, label)
            if et in _FIXED:
                pos += n * _FIXED[et]
            else:
                for i in range(n):
                    value(et, f"{label}[{i}]")
        else:
            field("scalar", _FIXED[vtype], label)

    field("magic", 4)
    field("version", 4)
    n_tensors = field("n_tensors", 8)
    n_kv = field("n_kv", 8)
    for _ in range(n_kv):
        klen = field("key_len", 8)
        key = buf[pos : pos + klen].decode()
        pos += klen
        value(field("vtype", 4, key), key)
    for _ in range(n_tensors):
        nlen = field("tname_len", 8)
        name = buf[pos : pos + nlen].decode()
        pos += nlen
        n_dims = field("n_dims", 4, name)
        for i in range(n_dims):
            field("dim", 8, f"{name}:{i}")
        field("ttype", 4, name)
        field("toffset", 8, name)
    return fields


LAYOUT = _layout(BASE)


def _find(kind: str, label: str = "") -> tuple[int, int]:
    for k, off, size, lab in LAYOUT:
        if k == kind and lab == label:
            return off, size
    raise KeyError((kind, label))


def _patch(buf: bytes, kind: str, label: str, value: int) -> bytes:
    off, size = _find(kind, label)
    return buf[:off] + (value % 2 ** (8 * size)).to_bytes(size, "little") + buf[off + size :]


def _open(tmp_path: Path, data: bytes, limit: int | None = None):
    """Parse `data`; return the GGUFFile or the GGUFError. Anything else fails the test.

    With `limit`, also check that the parse never held more than `limit` bytes."""
    path = tmp_path / "c.gguf"
    path.write_bytes(data)
    if limit is not None:
        tracemalloc.start()
    try:
        f = GGUFFile(path)
    except GGUFError as e:
        return e
    finally:
        if limit is not None:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert peak <= limit, f"parse held {peak} bytes for a {len(data)}-byte file"
    # a file that parses must be fully usable: touch every tensor byte
    for name, info in f.tensors.items():
        raw = f.raw(name)
        assert raw.nbytes == info.nbytes
        int(raw.sum())
    f.close()
    return f


def _limit(data: bytes) -> int:
    return 16 * len(data) + (256 << 10)


def _expect(tmp_path, data, error, limit=True):
    got = _open(tmp_path, data, _limit(data) if limit else None)
    assert isinstance(got, error), f"expected {error}, got {got!r}"
    return got


def test_base_file_is_valid(tmp_path):
    f = _open(tmp_path, BASE, _limit(BASE))
    assert isinstance(f, GGUFFile)
    assert len(f.metadata["a.tokens"]) == 70 and f.metadata["a.nested"][2] == []


# -- truncation -----------------------------------------------------------------------


def _data_end(data: bytes) -> int:
    with_file = _open_ok(data)
    return max(i.offset + i.nbytes for i in with_file.tensors.values())


def _open_ok(data: bytes) -> GGUFFile:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".gguf") as t:
        t.write(data)
        t.flush()
        f = GGUFFile(t.name)
        f.close()
        return f


def test_truncation_at_every_point(tmp_path):
    end = _data_end(BASE)
    for n in range(len(BASE)):
        got = _open(tmp_path, BASE[:n])
        if n >= end:  # only trailing padding was cut
            assert isinstance(got, GGUFFile), n
        else:
            assert isinstance(got, GGUFTruncatedError | GGUFBoundsError), (n, got)


@HYP
@given(data=st.data())
def test_truncated_tiny_model(tmp_path, data):
    src = tiny_path("llama").read_bytes()
    with GGUFFile(tiny_path("llama")) as f:
        header_end = f.data_offset
    n = data.draw(st.one_of(st.integers(0, header_end), st.integers(0, len(src) - 1)))
    got = _open(tmp_path, src[:n])
    assert isinstance(got, GGUFTruncatedError | GGUFBoundsError), (n, got)


# -- random damage ------------------------------------------------------------------


@HYP
@given(flips=st.lists(st.tuples(st.integers(0, len(BASE) - 1), st.integers(1, 255)), max_size=8))
def test_random_byte_flips(tmp_path, flips):
    buf = bytearray(BASE)
    for pos, x in flips:
        buf[pos] ^= x
    _open(tmp_path, bytes(buf), _limit(buf))  # a GGUFFile or a GGUFError, nothing else


_INTERESTING = [
    0,
    1,
    2,
    3,
    4,
    5,
    31,
    32,
    33,
    64,
    255,
    2**31,
    2**32 - 1,
    2**32,
    2**62,
    2**63,
    2**64 - 1,
]


def _expected_error(kind: str, value: int, size: int):
    """The error an integer field set to `value` must give, or None if any
    GGUFError (or success) is acceptable."""
    value %= 2 ** (8 * size)
    if kind in ("str_len", "arr_len", "n_tensors", "n_kv", "key_len", "tname_len"):
        return GGUFBoundsError if value > len(BASE) else None
    if kind in ("vtype", "etype"):
        return GGUFValueTypeError if value > 12 else None
    if kind == "magic":
        return GGUFMagicError if value != int.from_bytes(b"GGUF", "little") else None
    if kind == "version":
        return GGUFVersionError if value not in (2, 3) else None
    if kind == "n_dims":
        return GGUFTensorError if not 1 <= value <= 4 else None
    if kind == "ttype":
        return GGUFTensorError if value not in set(GGMLType) else None
    if kind == "dim":
        if value == 0 or value >= 2**63:
            return GGUFTensorError
        return (GGUFBoundsError, GGUFTensorError) if value > len(BASE) else None
    if kind == "toffset":
        if value % 32:
            return GGUFTensorError
        return GGUFBoundsError if value > len(BASE) else None
    return None  # scalar payloads


@HYP
@given(
    field=st.sampled_from(LAYOUT),
    value=st.one_of(st.sampled_from(_INTERESTING), st.integers(0, 2**64 - 1)),
)
def test_integer_fields(tmp_path, field, value):
    kind, off, size, _ = field
    buf = BASE[:off] + (value % 2 ** (8 * size)).to_bytes(size, "little") + BASE[off + size :]
    assume(buf != BASE)
    got = _open(tmp_path, buf, _limit(buf))
    want = _expected_error(kind, value, size)
    if want is not None:
        assert isinstance(got, want), (field, value, got)


# -- specific corruptions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "kind, label, value, error",
    [
        ("magic", "", int.from_bytes(b"GGML", "little"), GGUFMagicError),
        ("magic", "", 0, GGUFMagicError),
        ("version", "", 1, GGUFVersionError),
        ("version", "", 4, GGUFVersionError),
        ("version", "", 0, GGUFVersionError),
        ("version", "", 2**32 - 1, GGUFVersionError),
        ("version", "", 3 << 24, GGUFVersionError),  # big-endian v3
        ("n_tensors", "", 2**63, GGUFBoundsError),
        ("n_tensors", "", 2**64 - 1, GGUFBoundsError),
        ("n_kv", "", 2**63, GGUFBoundsError),
        ("n_kv", "", 10**6, GGUFBoundsError),
        ("key_len", "", 2**63, GGUFBoundsError),
        ("str_len", "a.str", 2**63, GGUFBoundsError),
        ("arr_len", "a.tokens", 2**63, GGUFBoundsError),
        ("arr_len", "a.scores", 2**62, GGUFBoundsError),
        ("arr_len", "a.nested", 2**63, GGUFBoundsError),
        ("str_len", "a.tokens[5]", 2**63, GGUFBoundsError),
        ("str_len", "a.tokens[69]", 2**64 - 1, GGUFBoundsError),
        ("tname_len", "", 2**63, GGUFBoundsError),
        ("vtype", "a.u32", 13, GGUFValueTypeError),
        ("vtype", "a.u32", 2**32 - 1, GGUFValueTypeError),
        ("etype", "a.tokens", 13, GGUFValueTypeError),
        ("etype", "a.nested[0]", 99, GGUFValueTypeError),
        ("vtype", "general.alignment", int(T.INT32), GGUFValueTypeError),
        ("scalar", "general.alignment", 0, GGUFTensorError),
        ("scalar", "general.alignment", 48, GGUFTensorError),
        ("scalar", "general.alignment", 64, GGUFTensorError),  # offsets no longer aligned
        ("ttype", "w.f32", 4, GGUFTensorError),  # Q4_2, removed from ggml
        ("ttype", "w.f32", 31, GGUFTensorError),  # Q4_0_4_4, removed from GGUF files
        ("ttype", "w.f32", 2**32 - 1, GGUFTensorError),
        ("toffset", "w.f16", 2**40, GGUFBoundsError),
        ("toffset", "w.f16", 2**64 - 32, GGUFBoundsError),
        ("toffset", "w.f16", 1, GGUFTensorError),  # misaligned
        ("toffset", "w.f16", 0, GGUFTensorError),  # overlaps w.q8
        ("n_dims", "w.f32", 0, GGUFTensorError),
        ("n_dims", "w.f32", 5, GGUFTensorError),
        ("n_dims", "w.f32", 2**32 - 1, GGUFTensorError),
        ("dim", "w.f32:1", 0, GGUFTensorError),
        ("dim", "w.f32:1", 2**64 - 1, GGUFTensorError),  # -1 as int64
        ("dim", "w.f32:0", 2**63, GGUFTensorError),  # most negative int64
        ("dim", "w.q8:0", 48, GGUFTensorError),  # not whole Q8_0 blocks
        ("dim", "w.f32:1", 2**62, GGUFBoundsError),  # overflow-sized
        ("dim", "w.q8:0", 2**62, GGUFBoundsError),
        ("dim", "w.f16:0", 2**63 - 1, GGUFBoundsError),
    ],
)
def test_specific_corruption(tmp_path, kind, label, value, error):
    _expect(tmp_path, _patch(BASE, kind, label, value), error)


def test_overflow_shape_product(tmp_path):
    buf = _patch(BASE, "dim", "w.f32:0", 2**31)
    buf = _patch(buf, "dim", "w.f32:1", 2**31)
    _expect(tmp_path, buf, GGUFBoundsError)


def test_short_files(tmp_path):
    _expect(tmp_path, b"", GGUFTruncatedError)
    _expect(tmp_path, b"GG", GGUFTruncatedError)
    _expect(tmp_path, b"GGUF\x03\x00", GGUFTruncatedError)
    _expect(tmp_path, b"XY", GGUFMagicError)
    _expect(tmp_path, b"\x00" * 64, GGUFMagicError)
    _expect(tmp_path, b"GGUF" + struct.pack("<IQQ", 3, 0, 0), GGUFFile)  # empty but valid


def _rename(buf: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and buf.count(old) == 1
    return buf.replace(old, new)


def test_duplicate_metadata_key(tmp_path):
    _expect(tmp_path, _rename(BASE, b"a.u32", b"a.f32"), GGUFDuplicateError)


def test_duplicate_tensor_name(tmp_path):
    _expect(tmp_path, _rename(BASE, b"w.f16", b"w.f32"), GGUFDuplicateError)


def test_arrays_nested_too_deep(tmp_path):
    depth = 12
    enc = struct.pack("<I", int(T.ARRAY))
    for _ in range(depth):
        enc += struct.pack("<IQ", int(T.ARRAY), 1)
    enc += struct.pack("<IQ", int(T.UINT8), 0)
    w = GGUFWriter(tmp_path / "deep.gguf")
    w.add_raw("deep", enc)
    w.write(fsync=False)
    _expect(tmp_path, (tmp_path / "deep.gguf").read_bytes(), GGUFValueTypeError)


def test_invalid_utf8_strings_are_replaced_not_raised(tmp_path):
    buf = BASE.replace(b"h\xc3\xa9llo", b"h\xff\xfello")
    f = _open(tmp_path, buf)
    assert isinstance(f, GGUFFile)
    assert f.metadata["a.str"] == "h\ufffd\ufffdllo"
    tokens = bytearray(BASE)
    off, _ = _find("str_len", "a.tokens[1]")
    tokens[off + 8] = 0xFF  # first byte of "t1": the bulk path must fall back
    f = _open(tmp_path, bytes(tokens))
    assert f.metadata["a.tokens"][1] == "\ufffd1"
    assert f.metadata["a.tokens"][2] == "t2"


def test_nul_bytes_inside_strings(tmp_path):
    w = GGUFWriter(tmp_path / "nul.gguf")
    tokens = [f"a\0{i}" if i % 3 else "\0" * 9 for i in range(100)]
    w.add("t", tokens)
    w.write(fsync=False)
    with GGUFFile(tmp_path / "nul.gguf") as f:
        assert f.metadata["t"] == tokens


def test_long_strings_in_a_string_array(tmp_path):
    w = GGUFWriter(tmp_path / "long.gguf")
    tokens = ["x" * (70000 if i == 50 else i) for i in range(100)]
    w.add("t", tokens)
    w.write(fsync=False)
    with GGUFFile(tmp_path / "long.gguf") as f:
        assert f.metadata["t"] == tokens
