"""Our writer on its own: type inference, explicit types, errors, atomicity,
streaming, copy_gguf edits, and a hypothesis round trip through both readers."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
from gguf_testlib import plain, tiny_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamay.errors import GGUFDuplicateError, GGUFWriteError
from llamay.gguf import (
    GGMLType,
    GGUFFile,
    GGUFWriter,
    TensorSpec,
    copy_gguf,
    tensor_spec,
    write_gguf,
)
from llamay.gguf.constants import GGUFValueType as T
from llamay.gguf.values import encode_value, infer_type

A = T.ARRAY


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, (T.BOOL, None)),
        (np.bool_(False), (T.BOOL, None)),
        (7, (T.INT32, None)),
        (-(2**31), (T.INT32, None)),
        (2**31, (T.INT64, None)),
        (-(2**63), (T.INT64, None)),
        (2**63, (T.UINT64, None)),
        (1.5, (T.FLOAT32, None)),
        (np.float64(1.5), (T.FLOAT64, None)),
        (np.uint16(3), (T.UINT16, None)),
        (np.int8(-3), (T.INT8, None)),
        ("s", (T.STRING, None)),
        (b"\xff", (T.STRING, None)),
        ([1, 2], (A, T.INT32)),
        ([1, 2**40], (A, T.INT64)),
        ([0, 2**64 - 1], (A, T.UINT64)),
        ([1, 2.5], (A, T.FLOAT32)),
        ([True, False], (A, T.BOOL)),
        (["a", b"b"], (A, T.STRING)),
        ([], (A, T.STRING)),
        ([[1], ["a"]], (A, A)),
        ((1, 2), (A, T.INT32)),
        (np.array([1, 2], np.uint8), (A, T.UINT8)),
        (np.array([1.0], np.float64), (A, T.FLOAT64)),
        (np.array([True]), (A, T.BOOL)),
        (np.array(["x", "yy"]), (A, T.STRING)),
        ([np.float64(1), np.float64(2)], (A, T.FLOAT64)),
        ([np.int16(1), np.int16(2)], (A, T.INT16)),
    ],
)
def test_infer_type(value, expected):
    assert infer_type(value) == expected


@pytest.mark.parametrize(
    "value",
    [None, 2**64, -(2**63) - 1, np.float16(1), {"a": 1}, [1, "a"], [True, 1], np.zeros((2, 2))],
)
def test_infer_type_rejects(value):
    with pytest.raises(GGUFWriteError):
        infer_type(value)


@pytest.mark.parametrize(
    "value, vtype",
    [
        (256, T.UINT8),
        (-1, T.UINT32),
        (2**63, T.INT64),
        (1.5, T.INT32),
        ("1", T.INT32),
        (True, T.INT32),
        (2, T.BOOL),
        (1e39, T.FLOAT32),
        ("x", T.FLOAT64),
        (5, T.STRING),
        ("\ud800", T.STRING),  # a lone surrogate outside surrogateescape's range
        (5, (A, T.INT32)),
        ([1, 256], (A, T.UINT8)),
        ([-1], (A, T.UINT64)),
        ([1.5], (A, T.INT32)),
        (np.array([1.5]), (A, T.INT32)),
        (np.array([-1]), (A, T.UINT8)),
        (np.array([1e39]), (A, T.FLOAT32)),
        ([2], (A, T.BOOL)),
        (["a"], (A, T.INT8)),
        ([1], (A, T.STRING)),
        ([1], (A, A)),
        (7, 99),
        (7, "UINT8"),
    ],
)
def test_explicit_type_checks_values(value, vtype):
    with pytest.raises(GGUFWriteError):
        encode_value(value, vtype)


def test_explicit_types_encode_exactly():
    assert encode_value(1, T.UINT8) == b"\x00\x00\x00\x00\x01"
    assert encode_value(-2, T.INT16) == b"\x03\x00\x00\x00\xfe\xff"
    assert encode_value(True, T.BOOL) == b"\x07\x00\x00\x00\x01"
    assert encode_value(1, T.BOOL) == b"\x07\x00\x00\x00\x01"
    assert encode_value("ab") == b"\x08\x00\x00\x00" + (2).to_bytes(8, "little") + b"ab"
    assert encode_value([1, 2], (A, T.UINT16)) == (
        b"\x09\x00\x00\x00\x02\x00\x00\x00" + (2).to_bytes(8, "little") + b"\x01\x00\x02\x00"
    )
    assert encode_value(np.array([1, 0], np.uint8), (A, T.BOOL))[-2:] == b"\x01\x00"
    assert encode_value(3, (T.UINT32, None)) == encode_value(3, T.UINT32)


def test_surrogateescape_strings_keep_their_bytes(tmp_path):
    raw = b"ok\xff\xfe"
    write_gguf(tmp_path / "s.gguf", {"k": raw.decode("utf-8", "surrogateescape"), "b": raw})
    with GGUFFile(tmp_path / "s.gguf") as f:
        assert f.raw_metadata("k") == f.raw_metadata("b")
        assert f.raw_metadata("k").endswith(raw)
        assert f.metadata["k"] == "ok\ufffd\ufffd"  # decoded for readers with replacement


def _small_tensors():
    return [
        TensorSpec.from_shape("a", (2, 32), GGMLType.Q8_0, np.zeros((2, 34), np.uint8)),
        tensor_spec("b", np.arange(6, dtype=np.float32).reshape(2, 3)),
    ]


def test_writer_class_and_tensor_inference(tmp_path):
    w = GGUFWriter(tmp_path / "w.gguf", alignment=64)
    w.add("general.architecture", "x")
    w.add("n", 3, T.UINT32)
    w.add_tensor("f16", np.ones((4, 2), np.float16))  # type and shape from the array
    w.add_tensor("q", np.zeros((3, 2 * 18), np.uint8), GGMLType.Q4_0)  # from the byte shape
    w.add_tensor("by_ne", b"\0" * 12, GGMLType.F32, ne=(3,))
    w.add_tensor("by_shape", bytearray(8), GGMLType.I16, shape=(2, 2))
    w.add_tensor(TensorSpec("spec", (2,), GGMLType.F32, lambda: np.ones(2, np.float32)))
    w.add_tensor("big_endian", np.arange(3, dtype=">f4"))
    w.write()
    with GGUFFile(tmp_path / "w.gguf") as f:
        assert f.alignment == 64 and f.metadata["general.alignment"] == 64
        assert f.metadata_types["general.alignment"] == (T.UINT32, None)
        got = {n: (i.ne, i.ggml_type) for n, i in f.tensors.items()}
        assert got == {
            "f16": ((2, 4), GGMLType.F16),
            "q": ((64, 3), GGMLType.Q4_0),
            "by_ne": ((3,), GGMLType.F32),
            "by_shape": ((2, 2), GGMLType.I16),
            "spec": ((2,), GGMLType.F32),
            "big_endian": ((3,), GGMLType.F32),
        }
        assert all(i.offset % 64 == 0 for i in f.tensors.values())
        np.testing.assert_array_equal(f.raw("big_endian").view("<f4"), [0, 1, 2])
        np.testing.assert_array_equal(f.raw("spec").view("<f4"), [1, 1])


def test_tensor_data_is_read_lazily_and_in_order(tmp_path):
    calls = []

    def data(name, n):
        def get():
            calls.append(name)
            return np.full(n, len(calls), np.float32)

        return get

    specs = [TensorSpec(f"t{i}", (4,), GGMLType.F32, data(f"t{i}", 4)) for i in range(3)]
    w = GGUFWriter(tmp_path / "lazy.gguf")
    for s in specs:
        w.add_tensor(s)
    assert calls == []
    w.write(fsync=False)
    assert calls == ["t0", "t1", "t2"]


@pytest.mark.parametrize(
    "build",
    [
        lambda w: w.add_tensor("a", np.zeros(3, np.float32), ne=(4,)),  # wrong byte count
        lambda w: w.add_tensor(TensorSpec("a", (4,), GGMLType.F32, lambda: b"\0" * 3)),
        lambda w: w.add_tensor(TensorSpec("a", (4,), GGMLType.F32, lambda: 42)),
    ],
)
def test_bad_tensor_data_fails_atomically(tmp_path, build):
    dst = tmp_path / "keep.gguf"
    dst.write_bytes(b"previous contents")
    w = GGUFWriter(dst)
    w.add("k", 1)
    build(w)
    with pytest.raises(GGUFWriteError):
        w.write()
    assert dst.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["keep.gguf"]  # no temporary file left behind


@pytest.mark.parametrize(
    "build, error",
    [
        (lambda w: [w.add("k", 1), w.add("k", 2)], GGUFDuplicateError),
        (
            lambda w: [w.add_tensor(*_small_tensors()[:1]), w.add_tensor(_small_tensors()[0])],
            GGUFDuplicateError,
        ),
        (lambda w: w.add_tensor("x", np.zeros(3, np.uint8)), GGUFWriteError),  # no type
        (lambda w: w.add_tensor("x", b"\0" * 4, GGMLType.F32), GGUFWriteError),  # no shape
        (lambda w: w.add_tensor("x", b"\0" * 4, GGMLType.F32, ne=(1,), shape=(1,)), GGUFWriteError),
        (lambda w: w.add_tensor("x", b"\0" * 18, GGMLType.Q4_0, ne=(16,)), GGUFWriteError),
        (lambda w: w.add_tensor("x", b"", GGMLType.F32, ne=(0,)), GGUFWriteError),
        (lambda w: w.add_tensor("x", b"", GGMLType.F32, ne=(1, 1, 1, 1, 1)), GGUFWriteError),
        (lambda w: w.add_tensor("x", b"\0" * 4, 99, ne=(1,)), GGUFWriteError),
        (lambda w: w.add_tensor("", b"\0" * 4, GGMLType.F32, ne=(1,)), GGUFWriteError),
        (lambda w: w.add_tensor("x", np.zeros((3, 5), np.uint8), GGMLType.Q8_0), GGUFWriteError),
        (lambda w: w.add_raw("k", b"\0"), GGUFWriteError),
        (lambda w: w.add(3, 1), GGUFWriteError),
    ],
)
def test_writer_rejects(tmp_path, build, error):
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(error):
        build(w)


@pytest.mark.parametrize(
    "kwargs, meta",
    [
        ({"alignment": 3}, {}),
        ({"alignment": 0}, {}),
        ({}, {"general.alignment": 64}),  # inferred INT32: readers want UINT32
        ({"alignment": 32}, {"general.alignment": (64, T.UINT32)}),
        ({}, {"general.alignment": (48, T.UINT32)}),
    ],
)
def test_alignment_errors(tmp_path, kwargs, meta):
    with pytest.raises(GGUFWriteError):
        w = GGUFWriter(tmp_path / "a.gguf", **kwargs)
        for k, v in meta.items():
            w.add(k, *v) if isinstance(v, tuple) else w.add(k, v)
        w.write()
    assert not any(tmp_path.iterdir())


def test_write_gguf_accepts_tuples_in_ne_order(tmp_path):
    data = np.arange(6, dtype=np.float32)
    write_gguf(tmp_path / "t.gguf", {"a": 1}, [("x", (3, 2), GGMLType.F32, data)])
    with GGUFFile(tmp_path / "t.gguf") as f:
        assert f.tensors["x"].ne == (3, 2) and f.tensors["x"].shape == (2, 3)
    with pytest.raises(GGUFWriteError):
        write_gguf(tmp_path / "t.gguf", {}, [("x", (3, 2))])


def test_copy_gguf_edits(tmp_path):
    src = tiny_path("llama")
    dst = tmp_path / "edited.gguf"
    new_embd = np.zeros_like(GGUFFile(src).raw("output_norm.weight"))
    copy_gguf(
        src,
        dst,
        metadata={
            "llama.context_length": 4096,  # keeps its UINT32 type
            "general.name": None,  # dropped
            "llamay.test": [1.5, 2.5],  # appended, inferred
            "llamay.typed": 7,
        },
        types={"llamay.typed": T.UINT8},
        tensors={
            "output.weight": None,  # dropped
            "output_norm.weight": new_embd,  # new data, same type/shape
            "extra": np.ones((2, 3), np.float32),  # appended
        },
        alignment=128,
    )
    with GGUFFile(src) as a, GGUFFile(dst) as b:
        assert b.metadata["llama.context_length"] == 4096
        assert b.metadata_types["llama.context_length"] == (T.UINT32, None)
        assert "general.name" not in b.metadata
        assert b.metadata_types["llamay.test"] == (A, T.FLOAT32)
        assert b.metadata_types["llamay.typed"] == (T.UINT8, None)
        assert b.alignment == 128
        keys = [k for k in a.metadata if k not in ("general.name",)]
        assert [k for k in b.metadata if k in a.metadata] == keys  # order kept
        for k in keys:
            if k != "llama.context_length":
                assert a.raw_metadata(k) == b.raw_metadata(k)
        assert "output.weight" not in b.tensors
        assert list(b.tensors)[-1] == "extra" and b.tensors["extra"].ne == (3, 2)
        assert not b.raw("output_norm.weight").any()
        for name in a.tensors:
            if name not in ("output.weight", "output_norm.weight"):
                assert np.array_equal(a.raw(name), b.raw(name)), name
                assert b.tensors[name].offset % 128 == 0


def test_copy_gguf_in_place(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_path("llama").read_bytes())
    with GGUFFile(path) as f:
        raw_before = f.raw("token_embd.weight").copy()
        copy_gguf(f, path, metadata={"general.name": "renamed"})
        assert np.array_equal(f.raw("token_embd.weight"), raw_before)  # old map still valid
    with GGUFFile(path) as g:
        assert g.metadata["general.name"] == "renamed"
        assert np.array_equal(g.raw("token_embd.weight"), raw_before)
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]


def test_copy_gguf_rejects_bad_edits(tmp_path):
    src = tiny_path("llama")
    with pytest.raises(GGUFWriteError):  # str for a UINT32 key, no type given
        copy_gguf(src, tmp_path / "x.gguf", metadata={"llama.context_length": "long"})
    with pytest.raises(GGUFWriteError):  # wrong byte count for the original shape
        copy_gguf(src, tmp_path / "x.gguf", tensors={"output_norm.weight": b"\0" * 3})
    with pytest.raises(GGUFWriteError):
        copy_gguf(
            src,
            tmp_path / "x.gguf",
            tensors={"output_norm.weight": TensorSpec("other", (1,), GGMLType.F32, b"\0" * 4)},
        )
    assert not any(tmp_path.iterdir())


# -- hypothesis: random typed metadata and tensors through both readers ------------------

_INT_RANGES = {
    T.UINT8: (0, 2**8 - 1),
    T.INT8: (-(2**7), 2**7 - 1),
    T.UINT16: (0, 2**16 - 1),
    T.INT16: (-(2**15), 2**15 - 1),
    T.UINT32: (0, 2**32 - 1),
    T.INT32: (-(2**31), 2**31 - 1),
    T.UINT64: (0, 2**64 - 1),
    T.INT64: (-(2**63), 2**63 - 1),
}
_text = st.text(st.characters(codec="utf-8"), max_size=12)


def _scalar(t):
    if t in _INT_RANGES:
        return st.integers(*_INT_RANGES[t])
    if t == T.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if t == T.FLOAT64:
        return st.floats(allow_nan=False)
    if t == T.BOOL:
        return st.booleans()
    return _text


_scalar_types = st.sampled_from([*_INT_RANGES, T.FLOAT32, T.FLOAT64, T.BOOL, T.STRING])


@st.composite
def _typed_value(draw, depth=0):
    kind = draw(st.sampled_from(["scalar", "array", "nested"] if depth == 0 else ["array"]))
    if kind == "scalar":
        t = draw(_scalar_types)
        return draw(_scalar(t)), t
    if kind == "array":
        t = draw(_scalar_types)
        return draw(st.lists(_scalar(t), max_size=80)), (A, t)
    inner = draw(st.lists(_typed_value(depth=1), max_size=4))
    # nested arrays: inner types come from the values, so use typed numpy arrays / str lists
    vals = [np.array(v, dtype=_np_dtype(t[1])) if t[1] != T.STRING else v for v, t in inner]
    vals = [v for v in vals if not (isinstance(v, list) and not v)]  # [] would read as STRING
    return vals, (A, A)


def _np_dtype(t):
    from llamay.gguf.constants import VALUE_DTYPES

    return np.bool_ if t == T.BOOL else VALUE_DTYPES[t]


_tensor_types = st.sampled_from(
    [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.I32]
)


@st.composite
def _tensor(draw, name):
    from llamay.gguf.constants import BLOCK_SIZES

    t = draw(_tensor_types)
    block, size = BLOCK_SIZES[t]
    ne = [block * draw(st.integers(1, 3))] + draw(st.lists(st.integers(1, 3), max_size=3))
    n = int(np.prod(ne)) // block * size
    data = draw(st.binary(min_size=n, max_size=n))
    return TensorSpec(name, tuple(ne), t, data)


@st.composite
def _gguf_content(draw):
    keys = draw(st.lists(st.text("abc.xyz_", min_size=1, max_size=8), unique=True, max_size=8))
    meta = {k: draw(_typed_value()) for k in keys}
    names = draw(st.lists(st.text("abcdef.", min_size=1, max_size=6), unique=True, max_size=4))
    tensors = [draw(_tensor(n)) for n in names]
    alignment = draw(st.sampled_from([None, 1, 8, 32, 256]))
    return meta, tensors, alignment


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=_gguf_content())
def test_random_files_round_trip(tmp_path, content):
    meta, tensors, alignment = content
    path = tmp_path / "h.gguf"
    write_gguf(
        path,
        {k: v for k, (v, _) in meta.items()},
        tensors,
        types={k: t for k, (_, t) in meta.items()},
        alignment=alignment,
        fsync=False,
    )
    with GGUFFile(path) as f:
        expect_keys = list(meta) + (
            ["general.alignment"]
            if alignment not in (None, 32) and "general.alignment" not in meta
            else []
        )
        assert list(f.metadata) == expect_keys
        for k, (v, t) in meta.items():
            got = f.metadata[k]
            want_t = t if isinstance(t, tuple) else (t, None)
            assert f.metadata_types[k] == want_t
            if want_t == (T.FLOAT32, None):
                assert got == float(np.float32(v))
            elif want_t[0] == A and want_t[1] not in (T.STRING, A):
                np.testing.assert_array_equal(got, np.array(v, dtype=_np_dtype(want_t[1])))
            elif want_t == (A, A):
                assert len(got) == len(v)
                for g, w in zip(got, v, strict=True):
                    if isinstance(w, np.ndarray):
                        assert g.dtype == w.dtype and np.array_equal(g, w)
                    else:
                        assert g == w
            else:
                assert plain(got) == v
        for spec in tensors:
            info = f.tensors[spec.name]
            assert (info.ne, info.ggml_type) == (spec.ne, spec.ggml_type)
            assert f.raw(spec.name).tobytes() == spec.data
        again = tmp_path / "again.gguf"
        write_gguf(
            again,
            f.metadata,
            [tensor_spec(n, f.raw(n), i.ggml_type) for n, i in f.tensors.items()],
            types=f.metadata_types,
            fsync=False,
        )
    assert again.read_bytes() == path.read_bytes()
    r = gguf.GGUFReader(str(path))
    assert [t.name for t in r.tensors] == [t.name for t in tensors]
    for k, (v, t) in meta.items():
        field = r.fields[k]
        assert field.types[0] == (A if isinstance(t, tuple) else t)
        if not isinstance(t, tuple) and t not in (T.FLOAT32,):
            assert field.contents() == v
