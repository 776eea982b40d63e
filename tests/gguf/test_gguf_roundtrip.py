"""Round trips against gguf-py: its writer -> our reader, our writer -> its reader,
both writers -> the same bytes, and re-writing real files byte for byte."""

from __future__ import annotations

import filecmp
import math

import gguf
import numpy as np
import pytest
from gguf_testlib import (
    TINY_MODELS,
    assert_matches_gguf_py,
    gguf_py_view,
    plain,
    reference_path,
    tiny_path,
)

from llamay.gguf import GGMLType, GGUFFile, TensorSpec, copy_gguf, tensor_spec, write_gguf
from llamay.gguf.constants import BLOCK_SIZES, VALUE_DTYPES
from llamay.gguf.constants import GGUFValueType as T

RNG = np.random.default_rng(0)

# (key, value, type) covering every value type; arrays given as (ARRAY, element type).
SCALARS = [
    ("t.u8", 255, T.UINT8),
    ("t.i8", -128, T.INT8),
    ("t.u16", 65535, T.UINT16),
    ("t.i16", -32768, T.INT16),
    ("t.u32", 2**32 - 1, T.UINT32),
    ("t.i32", -(2**31), T.INT32),
    ("t.f32", 0.1, T.FLOAT32),
    ("t.bool", True, T.BOOL),
    ("t.str", "héllo wörld ✓ \U0001f600", T.STRING),
    ("t.empty_str", "", T.STRING),
    ("t.u64", 2**64 - 1, T.UINT64),
    ("t.i64", -(2**63), T.INT64),
    ("t.f64", math.pi, T.FLOAT64),
]
NUMERIC_ARRAYS = [
    (T.UINT8, [0, 1, 255]),
    (T.INT8, [-128, 0, 127]),
    (T.UINT16, [0, 65535]),
    (T.INT16, [-32768, 32767]),
    (T.UINT32, [0, 2**32 - 1]),
    (T.INT32, [-(2**31), 2**31 - 1]),
    (T.FLOAT32, [0.5, -1.25, float("inf")]),
    (T.BOOL, [True, False, True]),
    (T.UINT64, [0, 2**64 - 1]),
    (T.INT64, [-(2**63), 2**63 - 1]),
    (T.FLOAT64, [math.e, -0.0, 1e300]),
]
STRINGS = ["a", "", "ü", "<|im_start|>", "Ġt", "\U0001f600"] * 20  # long enough for bulk
NESTED_INTS = [[1, 2, 3], [4], [-5, 6]]
NESTED_STRS = [["a", "bb"], ["ccc"]]

# Tensors: (name, numpy shape, type); data random bytes of the right size.
TENSORS = [
    ("f32", (3, 8), GGMLType.F32),
    ("f16", (5,), GGMLType.F16),
    ("bf16", (2, 4), GGMLType.BF16),
    ("i8", (7,), GGMLType.I8),
    ("i16", (3,), GGMLType.I16),
    ("i32", (2, 2), GGMLType.I32),
    ("i64", (3,), GGMLType.I64),
    ("f64", (2,), GGMLType.F64),
    ("q8_0", (2, 64), GGMLType.Q8_0),
    ("q4_1", (3, 32), GGMLType.Q4_1),
    ("q4_k", (2, 256), GGMLType.Q4_K),
    ("q6_k", (1, 2, 256), GGMLType.Q6_K),
    ("q5_0.4d", (2, 1, 3, 32), GGMLType.Q5_0),
]


def _tensor_bytes(shape, gtype) -> np.ndarray:
    block, size = BLOCK_SIZES[gtype]
    rows = int(np.prod(shape[:-1]))
    return RNG.integers(0, 256, size=(rows, shape[-1] // block * size), dtype=np.uint8)


TENSOR_DATA = {name: _tensor_bytes(shape, gtype) for name, shape, gtype in TENSORS}


def _expected_metadata():
    """(key, value, type) in file order, as our writer is asked to write them."""
    items = [("general.architecture", "test", T.STRING)]
    items += SCALARS
    items += [(f"t.arr.{t.name}", v, (T.ARRAY, t)) for t, v in NUMERIC_ARRAYS]
    items += [("t.arr.str", STRINGS, (T.ARRAY, T.STRING))]
    items += [("t.arr.nested_int", NESTED_INTS, (T.ARRAY, T.ARRAY))]
    items += [("t.arr.nested_str", NESTED_STRS, (T.ARRAY, T.ARRAY))]
    return items


def _write_with_gguf_py(path, alignment):
    w = gguf.GGUFWriter(str(path), "test")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype in _expected_metadata()[1:]:
        if isinstance(vtype, tuple):
            sub = None if vtype[1] == T.ARRAY else gguf.GGUFValueType(vtype[1])
            w.add_key_value(key, list(value), gguf.GGUFValueType.ARRAY, sub_type=sub)
        elif vtype == T.STRING and value == "":
            w.add_key_value(key, value, gguf.GGUFValueType.STRING)  # add_string drops ""
        else:
            w.add_key_value(key, value, gguf.GGUFValueType(vtype))
    for name, shape, gtype in TENSORS:
        data = TENSOR_DATA[name]
        byte_shape = (*shape[:-1], data.shape[-1])  # gguf-py derives ne from the byte shape
        w.add_tensor(name, data.reshape(byte_shape), raw_dtype=gguf.GGMLQuantizationType(gtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_with_ours(path, alignment):
    items = _expected_metadata()
    if alignment is not None:
        items.insert(1, ("general.alignment", alignment, T.UINT32))
    write_gguf(
        path,
        {k: v for k, v, _ in items},
        [
            TensorSpec.from_shape(name, shape, gtype, TENSOR_DATA[name])
            for name, shape, gtype in TENSORS
        ],
        types={k: t for k, _, t in items},
        fsync=False,
    )


def _values_equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _check_our_read(path, alignment):
    with GGUFFile(path) as f:
        assert f.version == 3
        assert f.alignment == (alignment or 32)
        assert f.data_offset % f.alignment == 0
        for key, value, vtype in _expected_metadata():
            got = f.metadata[key]
            if isinstance(vtype, tuple):
                assert f.metadata_types[key] == vtype, key
                if vtype[1] in (T.STRING, T.ARRAY):
                    assert plain(got) == value, key
                else:
                    assert isinstance(got, np.ndarray) and got.ndim == 1
                    expect = np.array(value, dtype=got.dtype)
                    np.testing.assert_array_equal(got, expect)
            else:
                assert f.metadata_types[key] == (vtype, None), key
                if vtype == T.FLOAT32:
                    assert got == float(np.float32(value))
                else:
                    assert _values_equal(got, value) and type(got) is type(value), key
        assert list(f.tensors) == [n for n, _, _ in TENSORS]
        for name, shape, gtype in TENSORS:
            info = f.tensors[name]
            assert info.shape == shape and info.ggml_type == gtype
            assert info.offset % f.alignment == 0
            np.testing.assert_array_equal(f.raw(name).reshape(-1), TENSOR_DATA[name].reshape(-1))


@pytest.mark.parametrize("alignment", [None, 64, 1, 4096])
def test_gguf_py_writer_to_our_reader(tmp_path, alignment):
    path = tmp_path / "py.gguf"
    _write_with_gguf_py(path, alignment)
    _check_our_read(path, alignment)


@pytest.mark.parametrize("alignment", [None, 64, 1, 4096])
def test_our_writer_to_gguf_py_reader(tmp_path, alignment):
    path = tmp_path / "ours.gguf"
    _write_with_ours(path, alignment)
    _check_our_read(path, alignment)
    r = gguf.GGUFReader(str(path))
    assert r.alignment == (alignment or 32)
    for key, value, vtype in _expected_metadata():
        field = r.fields[key]
        if isinstance(vtype, tuple):
            assert field.types[:2] == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(vtype[1])]
            if vtype[1] == T.ARRAY:  # gguf-py flattens nested arrays
                flat = [x for inner in value for x in inner]
                assert field.contents() == flat, key
            elif vtype[1] == T.STRING:
                assert field.contents() == value, key
            else:
                dt = VALUE_DTYPES[vtype[1]] if vtype[1] != T.BOOL else np.bool_
                np.testing.assert_array_equal(
                    np.array(field.contents(), dtype=dt), np.array(value, dtype=dt)
                )
        else:
            assert field.types == [gguf.GGUFValueType(vtype)], key
            got = field.contents()
            if vtype == T.FLOAT32:
                assert got == float(np.float32(value))
            else:
                assert got == value, key
    assert [t.name for t in r.tensors] == [n for n, _, _ in TENSORS]
    for t, (name, shape, gtype) in zip(r.tensors, TENSORS, strict=True):
        assert t.tensor_type == gtype
        assert tuple(int(d) for d in t.shape) == tuple(reversed(shape))
        assert np.ascontiguousarray(t.data).tobytes() == TENSOR_DATA[name].tobytes()


@pytest.mark.parametrize("alignment", [None, 64, 1, 4096])
def test_both_writers_produce_identical_bytes(tmp_path, alignment):
    _write_with_gguf_py(tmp_path / "py.gguf", alignment)
    _write_with_ours(tmp_path / "ours.gguf", alignment)
    assert (tmp_path / "py.gguf").read_bytes() == (tmp_path / "ours.gguf").read_bytes()


def _rewrite_both_ways(src, tmp_path):
    """Re-write `src` from its parsed values (types from metadata_types) and by copy."""
    by_value, by_copy = tmp_path / "by_value.gguf", tmp_path / "by_copy.gguf"
    with GGUFFile(src) as f:
        write_gguf(
            by_value,
            f.metadata,
            [tensor_spec(n, f.raw(n), i.ggml_type) for n, i in f.tensors.items()],
            types=f.metadata_types,
            fsync=False,
        )
        copy_gguf(f, by_copy, fsync=False)
    return by_value, by_copy


@pytest.mark.parametrize("model", TINY_MODELS)
def test_rewrite_tiny_model_is_byte_identical(tmp_path, model):
    src = tiny_path(model)
    for out in _rewrite_both_ways(src, tmp_path):
        assert filecmp.cmp(src, out, shallow=False), out.name


def test_rewritten_tiny_model_reads_the_same_in_gguf_py(tmp_path):
    # gguf-py's view of the re-written file equals our reader's view of the original
    # (which test_gguf_reader holds equal to gguf-py's view of the original)
    src = tiny_path("llama")
    by_value, _ = _rewrite_both_ways(src, tmp_path)
    with GGUFFile(src) as f:
        assert_matches_gguf_py(f, gguf_py_view(str(by_value)))


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_rewrite_reference_model_is_byte_identical(request, tmp_path, name):
    src = reference_path(request, name)
    for out in _rewrite_both_ways(src, tmp_path):
        assert filecmp.cmp(src, out, shallow=False), out.name
        out.unlink()


@pytest.mark.model
def test_rewritten_reference_model_reads_the_same_in_gguf_py(request, tmp_path):
    src = reference_path(request, "smollm2")
    by_value, by_copy = _rewrite_both_ways(src, tmp_path)
    by_copy.unlink()
    with GGUFFile(by_value) as f:
        assert_matches_gguf_py(f, gguf_py_view(str(src)))
    again = gguf_py_view(str(by_value))
    original = gguf_py_view(str(src))
    assert again["fields"] == original["fields"]
    assert again["tensors"] == original["tensors"]
