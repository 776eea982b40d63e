"""The release check "verify against a generated model" (scripts/verify_generated_model.py):
it passes on llamay, and it fails when the generated file and the reference disagree."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import verify_generated_model as vgm  # noqa: E402


@pytest.mark.slow
def test_llamay_matches_the_reference_on_a_generated_model(tmp_path):
    assert vgm.verify(tmp_path, seed=0) == []


def test_the_reference_is_sensitive(tmp_path):
    """The check would notice a wrong network: one norm weight 1 % off, or a swapped rope
    pair order, moves the reference's logits by more than the tolerance."""
    w = vgm.make_model(tmp_path / "m.gguf", seed=3)
    base = vgm.reference_logits(w, vgm.PROMPT)
    off = dict(w, **{"blk.1.ffn_norm.weight": w["blk.1.ffn_norm.weight"] * 1.01})
    assert np.abs(vgm.reference_logits(off, vgm.PROMPT) - base).max() > vgm.LOGIT_TOL
    q = w["blk.0.attn_q.weight"].reshape(vgm.N_HEADS, vgm.HEAD_DIM // 2, 2, vgm.D_MODEL)
    swapped = dict(w, **{"blk.0.attn_q.weight": q[:, :, ::-1].reshape(vgm.D_MODEL, vgm.D_MODEL)})
    assert np.abs(vgm.reference_logits(swapped, vgm.PROMPT) - base).max() > vgm.LOGIT_TOL


def test_q8_0_packing_is_ggml_layout():
    from llamay.gguf import GGMLType
    from llamay.quant import dequantize

    rng = np.random.default_rng(0)
    raw, deq = vgm.q8_0(rng.standard_normal((4, 64)))
    blocks = np.frombuffer(raw, np.uint8).reshape(4, 68)
    np.testing.assert_array_equal(dequantize(blocks, GGMLType.Q8_0).reshape(4, 64), deq)
