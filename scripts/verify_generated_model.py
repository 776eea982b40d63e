"""Verify llamay against a model generated on the spot (a release check; `make check` runs it).

Writes a tiny random llama-architecture GGUF with llamay's own writer
(`llamay.gguf.write_gguf`: Q8_0 matmul weights packed here in numpy, F32 norms,
grouped-query attention), loads it with `llamay.load` (exact numerics) and compares with
an independent float64 numpy implementation of the same network: the logits of a prompt
(|diff| <= 1e-3) and 8 greedy tokens through the KV cache (identical).

    python scripts/verify_generated_model.py [--keep DIR] [--seed N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The network: small enough to compile in seconds, big enough to exercise every piece.
N_LAYERS, D_MODEL, N_HEADS, N_KV_HEADS, FFN, VOCAB, CTX = 2, 64, 4, 2, 96, 128, 64
HEAD_DIM = D_MODEL // N_HEADS
EPS, ROPE_BASE = 1e-5, 10000.0
LOGIT_TOL = 1e-3
PROMPT = [1, 17, 42, 99, 5, 64, 23, 7, 88, 3, 120]
N_GREEDY = 8


def q8_0(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Pack float rows [out, in] into GGML Q8_0 blocks (f16 scale + 32 int8) in numpy;
    returns (raw bytes [out, in/32 * 34], the dequantised float64 values)."""
    out, inp = w.shape
    blocks = w.reshape(out, inp // 32, 32).astype(np.float32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    d = amax / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0.0)
    q = np.clip(np.round(blocks * inv), -127, 127).astype(np.int8)
    d16 = d.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8).reshape(out, inp // 32, 2), q.view(np.uint8)], -1)
    deq = d16.astype(np.float64) * q.astype(np.float64)
    return raw.reshape(out, -1).tobytes(), deq.reshape(out, inp)


def make_model(path: Path, seed: int) -> dict[str, np.ndarray]:
    """Write the GGUF; returns the float64 weights the file holds (after quantisation)."""
    from llamay.gguf import GGMLType, TensorSpec, write_gguf

    rng = np.random.default_rng(seed)
    ref: dict[str, np.ndarray] = {}
    tensors: list[TensorSpec] = []

    def f32(name: str, arr: np.ndarray) -> None:
        arr = arr.astype(np.float32)
        ref[name] = arr.astype(np.float64)
        tensors.append(TensorSpec.from_shape(name, arr.shape, GGMLType.F32, arr))

    def q8(name: str, shape: tuple[int, int], scale: float) -> None:
        raw, deq = q8_0(rng.standard_normal(shape) * scale)
        ref[name] = deq
        tensors.append(TensorSpec.from_shape(name, shape, GGMLType.Q8_0, raw))

    q8("token_embd.weight", (VOCAB, D_MODEL), 1.0)
    q8("output.weight", (VOCAB, D_MODEL), 1.0)
    f32("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(D_MODEL))
    kv = N_KV_HEADS * HEAD_DIM
    for i in range(N_LAYERS):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D_MODEL))
        q8(b + "attn_q.weight", (D_MODEL, D_MODEL), D_MODEL**-0.5)
        q8(b + "attn_k.weight", (kv, D_MODEL), D_MODEL**-0.5)
        q8(b + "attn_v.weight", (kv, D_MODEL), D_MODEL**-0.5)
        q8(b + "attn_output.weight", (D_MODEL, D_MODEL), D_MODEL**-0.5)
        f32(b + "ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(D_MODEL))
        q8(b + "ffn_gate.weight", (FFN, D_MODEL), D_MODEL**-0.5)
        q8(b + "ffn_up.weight", (FFN, D_MODEL), D_MODEL**-0.5)
        q8(b + "ffn_down.weight", (D_MODEL, FFN), FFN**-0.5)

    tokens = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(VOCAB - 3)]
    meta = {
        "general.architecture": "llama",
        "general.name": "llamay-verify-tiny",
        "llama.block_count": N_LAYERS,
        "llama.context_length": CTX,
        "llama.embedding_length": D_MODEL,
        "llama.feed_forward_length": FFN,
        "llama.attention.head_count": N_HEADS,
        "llama.attention.head_count_kv": N_KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": EPS,
        "llama.rope.freq_base": ROPE_BASE,
        "llama.rope.dimension_count": HEAD_DIM,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array(
            [0.0] * 3 + [-float(i) for i in range(VOCAB - 3)], dtype=np.float32
        ),
        "tokenizer.ggml.token_type": np.array([2, 3, 3] + [1] * (VOCAB - 3), dtype=np.int32),
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    write_gguf(path, meta, tensors)
    return ref


# -- the float64 reference -------------------------------------------------------------------


def rms_norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """llama.cpp's NORM rope: rotate adjacent pairs (2i, 2i+1) by pos * base^(-2i/d)."""
    half = HEAD_DIM // 2
    theta = pos[:, None] * ROPE_BASE ** (-np.arange(half) * 2.0 / HEAD_DIM)  # [T, half]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def reference_logits(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    group = N_HEADS // N_KV_HEADS
    for i in range(N_LAYERS):
        b = f"blk.{i}."
        h = rms_norm(x, w[b + "attn_norm.weight"])
        q = rope((h @ w[b + "attn_q.weight"].T).reshape(T, N_HEADS, HEAD_DIM), pos)
        k = rope((h @ w[b + "attn_k.weight"].T).reshape(T, N_KV_HEADS, HEAD_DIM), pos)
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, N_KV_HEADS, HEAD_DIM)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(HEAD_DIM) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, D_MODEL)
        x = x + o @ w[b + "attn_output.weight"].T
        h = rms_norm(x, w[b + "ffn_norm.weight"])
        g = h @ w[b + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ w[b + "ffn_up.weight"].T)) @ w[b + "ffn_down.weight"].T
    return rms_norm(x, w["output_norm.weight"]) @ w["output.weight"].T


def reference_greedy(w: dict[str, np.ndarray], ids: list[int], n: int) -> list[int]:
    ids, out = list(ids), []
    for _ in range(n):
        nxt = int(reference_logits(w, ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


# -- the check --------------------------------------------------------------------------------


def verify(workdir: Path, seed: int = 0) -> list[str]:
    """Generate, run and compare; returns the failures (empty: verified)."""
    import llamay
    from llamay.sample import GREEDY

    path = workdir / "verify-tiny-llama.gguf"
    w = make_model(path, seed)
    m = llamay.load(path, numerics="exact")
    failures = []
    got = np.asarray(m.logits(PROMPT), dtype=np.float64)
    want = reference_logits(w, PROMPT)
    if got.shape != want.shape:
        return [f"logits shape {got.shape}, reference {want.shape}"]
    err = float(np.abs(got - want).max())
    print(f"[verify] logits of a {len(PROMPT)}-token prompt: max |llamay - reference| = {err:.2e}")
    if not err <= LOGIT_TOL:
        failures.append(f"logits differ from the float64 reference by {err:.3g} > {LOGIT_TOL}")
    gen = list(m.generation(PROMPT, max_tokens=N_GREEDY, sampler=GREEDY))
    ref = reference_greedy(w, PROMPT, N_GREEDY)
    print(f"[verify] greedy: llamay {gen}, reference {ref}")
    if gen != ref:
        failures.append(f"greedy tokens differ: llamay {gen}, reference {ref}")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", type=Path, help="write the model into DIR and keep it")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        failures = verify(args.keep, args.seed)
    else:
        with tempfile.TemporaryDirectory(prefix="llamay-verify-") as tmp:
            failures = verify(Path(tmp), args.seed)
    if failures:
        print("[verify] FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("[verify] ok: llamay matches the float64 reference on a generated model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
