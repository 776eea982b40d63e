"""Hostile model metadata is refused before anything is built from it (issue 22.4).

Each case is a tiny model of tests/fixtures/tiny rewritten with `copy_gguf`: the
reported headers (`block_count = 2**31 - 1`, `head_count = 0`, `embedding_length = 3`,
`head_count_kv = 0`, Q8_1 / I32 tensors), their neighbours, and a seeded corpus of
random header mutations. `llamay.load` must refuse each with a `ModelFormatError` (or
`UnsupportedTensorTypeError`) naming the key or tensor, within a memory bound — never a
bare Python error, never an allocation sized by the hostile value.
"""

from __future__ import annotations

import random
import time
import tracemalloc

import numpy as np
import pytest
from fixture_data import tiny_model_file

import llamay
from llamay.errors import LlamayError, ModelFormatError, UnsupportedTensorTypeError
from llamay.gguf import GGUFFile
from llamay.gguf.constants import GGMLType, GGUFValueType
from llamay.gguf.writer import TensorSpec, copy_gguf

# What refusing may cost: the tiny model's header and tensor table, nothing sized by a
# hostile count (2**31 tensor names were ~100 GB).
MEMORY_BOUND = 32 << 20
TIME_BOUND_S = 20.0  # generous: the machine is shared


@pytest.fixture(scope="module")
def tiny_llama():
    path = tiny_model_file("llama")
    llamay.load(path)  # imports and caches warm, so the bound measures the refusal only
    return GGUFFile(path)


def hostile(tmp_path, src: GGUFFile, name: str, **changes):
    path = tmp_path / f"{name}.gguf"
    copy_gguf(src, path, fsync=False, **changes)
    return path


def load_refused(path) -> LlamayError:
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises((ModelFormatError, UnsupportedTensorTypeError)) as e:
            llamay.load(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < TIME_BOUND_S
    assert peak < MEMORY_BOUND, f"{peak} bytes traced while refusing {path.name}"
    return e.value


S = GGUFValueType.STRING
CASES = [
    # (name, metadata changes, types, words the message must contain)
    ("block_count_2p31", {"llama.block_count": 2**31 - 1}, {}, ["llama.block_count"]),
    ("block_count_4096", {"llama.block_count": 4096}, {}, ["llama.block_count", "4 layers"]),
    ("block_count_5", {"llama.block_count": 5}, {}, ["llama.block_count", "blk.4."]),
    ("block_count_0", {"llama.block_count": 0}, {}, ["llama.block_count"]),
    ("head_count_0", {"llama.attention.head_count": 0}, {}, ["llama.attention.head_count"]),
    ("head_count_8", {"llama.attention.head_count": 8}, {}, ["rope.dimension_count"]),
    ("embedding_length_3", {"llama.embedding_length": 3}, {}, ["llama.embedding_length"]),
    ("embedding_length_128", {"llama.embedding_length": 128}, {}, ["token_embd.weight"]),
    ("head_count_kv_0", {"llama.attention.head_count_kv": 0}, {}, ["head_count_kv"]),
    ("head_count_kv_3", {"llama.attention.head_count_kv": 3}, {}, ["head_count_kv"]),
    ("head_count_kv_4", {"llama.attention.head_count_kv": 4}, {}, ["blk.0.attn_k.weight"]),
    ("key_length_0", {"llama.attention.key_length": 0}, {}, ["attention.key_length"]),
    ("ffn_96", {"llama.feed_forward_length": 96}, {}, ["feed_forward_length"]),
    ("vocab_1000", {"llama.vocab_size": 1000}, {}, ["vocab_size"]),
    ("no_vocab", {"llama.vocab_size": None, "tokenizer.ggml.tokens": None}, {}, ["vocab_size"]),
    (
        "vocab_1000_and_tokens",
        {"llama.vocab_size": 1000, "tokenizer.ggml.tokens": None},
        {},
        ["token_embd.weight", "vocab_size"],
    ),
    ("ctx_string", {"llama.context_length": "big"}, {"llama.context_length": S}, ["integer"]),
    (
        "ctx_2p40",
        {"llama.context_length": 2**40},
        {"llama.context_length": GGUFValueType.UINT64},
        ["llama.context_length"],
    ),
    ("eps_nan", {"llama.attention.layer_norm_rms_epsilon": float("nan")}, {}, ["epsilon"]),
    ("rope_base_inf", {"llama.rope.freq_base": float("inf")}, {}, ["rope.freq_base"]),
    ("rope_dims_odd", {"llama.rope.dimension_count": 15}, {}, ["rope.dimension_count"]),
    (
        "head_count_array",
        {"llama.attention.head_count": [4, 4, 4, 4]},
        {"llama.attention.head_count": (GGUFValueType.ARRAY, GGUFValueType.UINT32)},
        ["integer"],
    ),
]


@pytest.mark.parametrize("name,metadata,types,words", CASES, ids=[c[0] for c in CASES])
def test_hostile_header_refused(tiny_llama, tmp_path, name, metadata, types, words):
    path = hostile(tmp_path, tiny_llama, name, metadata=metadata, types=types)
    msg = str(load_refused(path))
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("ggml_type", [GGMLType.Q8_1, GGMLType.I32])
def test_unsupported_tensor_type_refused(tiny_llama, tmp_path, ggml_type):
    """A bound tensor of a type llamay has no kernels for: refused naming the tensor and
    type, not a bare KeyError."""
    from llamay.gguf.constants import BLOCK_SIZES

    elems, nbytes = BLOCK_SIZES[ggml_type]
    ne = (elems, 16)
    data = np.zeros(16 * nbytes, np.uint8)
    spec = TensorSpec("blk.0.attn_q.weight", ne, ggml_type, data)
    path = hostile(tmp_path, tiny_llama, ggml_type.name, tensors={spec.name: spec})
    err = load_refused(path)
    assert isinstance(err, UnsupportedTensorTypeError)
    assert "blk.0.attn_q.weight" in str(err) and ggml_type.name in str(err)


def test_tokenizer_shorter_than_the_embedding_refused(tiny_llama, tmp_path):
    """As llama.cpp: the embedding has a row per token of the tokenizer (a model that
    generates an id the tokenizer cannot spell failed in detokenisation)."""
    tokens = tiny_llama.metadata["tokenizer.ggml.tokens"][:100]
    types = tiny_llama.metadata["tokenizer.ggml.token_type"][:100]
    short = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    path = hostile(tmp_path, tiny_llama, "short", metadata=short)
    assert "vocab_size is 49152" in str(load_refused(path))
    path = hostile(tmp_path, tiny_llama, "short2", metadata=short | {"llama.vocab_size": None})
    assert "token_embd.weight" in str(load_refused(path))


def test_reshaped_tensor_refused(tiny_llama, tmp_path):
    """Same bytes, another shape: [64, 64] stored as [128, 32]."""
    raw = tiny_llama.raw("blk.2.attn_q.weight")
    spec = TensorSpec("blk.2.attn_q.weight", (128, 32), GGMLType.F32, raw)
    path = hostile(tmp_path, tiny_llama, "reshaped", tensors={spec.name: spec})
    assert "blk.2.attn_q.weight" in str(load_refused(path))


OTHER_FAMILIES = [
    ("qwen3moe", {"qwen3moe.expert_count": 0}, ["qwen3moe.expert_count"]),
    ("qwen3moe", {"qwen3moe.expert_count": 8}, ["ffn_gate_inp", "expert_count"]),
    ("qwen3moe", {"qwen3moe.expert_used_count": 5}, ["expert_used_count"]),
    ("qwen3moe", {"qwen3moe.expert_feed_forward_length": 128}, ["ffn_gate_exps"]),
    ("qwen3moe", {"qwen3moe.attention.key_length": 16}, ["key_length"]),
    ("gemma3", {"gemma3.attention.sliding_window": -1}, ["sliding_window"]),
    ("gemma3", {"gemma3.attention.sliding_window": 2**40}, ["sliding_window"]),
    ("gemma3", {"gemma3.block_count": 7}, ["gemma3.block_count", "blk.6."]),
    ("gemma3", {"gemma3.rope.freq_base_swa": float("nan")}, ["freq_base_swa"]),
]


@pytest.mark.parametrize("model,metadata,words", OTHER_FAMILIES)
def test_hostile_header_of_other_families(tiny_llama, tmp_path, model, metadata, words):
    src = GGUFFile(tiny_model_file(model))
    types = {k: GGUFValueType.INT64 for k, v in metadata.items() if isinstance(v, int)}
    path = hostile(tmp_path, src, model, metadata=metadata, types=types)
    msg = str(load_refused(path))
    for w in words:
        assert w in msg, msg


# -- a seeded corpus of header mutations -------------------------------------------------

HOSTILE_INTS = [0, -1, 1, 2, 3, 7, 63, 65, 4097, 2**31 - 1, 2**32 - 1, 2**63 - 1]
HOSTILE_FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e30]
N_MUTANTS = 30


def mutants(src: GGUFFile, seed: int = 22) -> list[tuple[str, dict, dict]]:
    rng = random.Random(seed)
    keys = [k for k in src.metadata if k.startswith("llama.")]
    out = []
    for n in range(N_MUTANTS):
        metadata, types = {}, {}
        for key in rng.sample(keys, rng.choice([1, 1, 2, 3])):
            value = src.metadata[key]
            if isinstance(value, float) or rng.random() < 0.15:
                metadata[key] = rng.choice(HOSTILE_FLOATS)
                types[key] = GGUFValueType.FLOAT32
            else:
                metadata[key] = rng.choice(HOSTILE_INTS)
                types[key] = GGUFValueType.INT64
        out.append((f"mutant{n}", metadata, types))
    return out


def test_seeded_header_corpus(tiny_llama, tmp_path):
    """Every mutant either loads (the mutation was harmless) or is refused cleanly; at
    least most of them are refused."""
    refused = 0
    for name, metadata, types in mutants(tiny_llama):
        path = hostile(tmp_path, tiny_llama, name, metadata=metadata, types=types)
        tracemalloc.start()
        try:
            llamay.load(path)
        except (ModelFormatError, UnsupportedTensorTypeError):
            refused += 1
            _, peak = tracemalloc.get_traced_memory()
            assert peak < MEMORY_BOUND, (name, metadata, peak)
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"{name} {metadata}: {type(e).__name__}: {e}")
        finally:
            tracemalloc.stop()
    print(f"\nhostile header corpus: {refused} of {N_MUTANTS} mutants refused, the rest loaded")
    assert refused >= N_MUTANTS // 2


def tensor_mutants(src: GGUFFile, seed: int = 22, n: int = 12) -> list[tuple[str, dict]]:
    """Tensor-table mutations that keep each tensor's bytes: float matrices given another
    shape of the same size, or another float type of the same width."""
    rng = random.Random(seed)
    floats = [
        name
        for name, t in src.tensors.items()
        if t.ggml_type in (GGMLType.F32, GGMLType.F16) and len(t.ne) == 2
    ]
    out = []
    for i in range(n):
        name = rng.choice(floats)
        info = src.tensors[name]
        a, b = info.ne
        k = rng.choice([2, 4, 8])
        ne = rng.choice([(b, a), (a * k, b // k), (a // k, b * k), (a * b,)])
        ggml_type = info.ggml_type
        if rng.random() < 0.3 and ggml_type == GGMLType.F16:
            ggml_type = GGMLType.BF16  # same width, other numbers: loads, harmless
        out.append((f"tmutant{i}", {name: TensorSpec(name, ne, ggml_type, src.raw(name))}))
    return out


def test_seeded_tensor_table_corpus(tiny_llama, tmp_path):
    """Reshaped tensors are refused naming the tensor (or load when the shape is the
    same after all); nothing else escapes."""
    refused = 0
    for name, tensors in tensor_mutants(tiny_llama):
        path = hostile(tmp_path, tiny_llama, name, tensors=tensors)
        (tensor,) = tensors
        try:
            llamay.load(path)
        except ModelFormatError as e:
            refused += 1
            assert tensor in str(e), str(e)
        except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"{name} {tensor}: {type(e).__name__}: {e}")
    assert refused >= 6
