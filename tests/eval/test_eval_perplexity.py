"""Perplexity as llama.cpp computes it, against its golden for SmolLM2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from llamay.errors import RequestError
from llamay.eval import perplexity
from llamay.eval.perplexity import chunks_of

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40


def test_tiny_perplexity_by_hand(tiny_llama_model, log_softmax):
    m = tiny_llama_model
    ctx = 32
    r = perplexity(m, TEXT, ctx=ctx, batch=2, max_chunks=3)
    _, chunks = chunks_of(m, TEXT, ctx, 3)
    nll = []
    for c in chunks:
        ls = log_softmax(m.logits(c.tolist()))
        nll += [-ls[j, c[j + 1]] for j in range(ctx // 2, ctx - 1)]
    assert r.n_chunks == 3 and r.scored_per_chunk == ctx // 2 - 1
    assert r.ppl == pytest.approx(math.exp(np.mean(nll)), rel=1e-4)
    assert r.running_ppl[-1] == pytest.approx(r.ppl)
    assert r.uncertainty > 0
    again = perplexity(m, TEXT, ctx=ctx, batch=1, max_chunks=3)
    assert again.ppl == pytest.approx(r.ppl, rel=1e-5)


def test_chunks_drop_the_remainder(tiny_llama_model):
    m = tiny_llama_model
    n_tokens, chunks = chunks_of(m, TEXT, 64)
    assert chunks.shape == (n_tokens // 64, 64)
    with pytest.raises(RequestError, match="fewer than one chunk"):
        perplexity(m, "short", ctx=64)
    with pytest.raises(RequestError, match="even"):
        perplexity(m, TEXT, ctx=33)


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_perplexity_matches_llamacpp(smollm2_model, fixtures_dir):
    d = fixtures_dir / "llamacpp" / "perplexity"
    gold = json.loads((d / "smollm2-135m-instruct-q4_1.GPL-3.ctx512.json").read_text())
    text = (d / gold["text"]).read_text()
    m = smollm2_model
    assert m.tokenizer.add_bos == gold["add_bos"]
    r = perplexity(m, text, ctx=gold["n_ctx"], batch=2)
    assert r.n_tokens == gold["n_tokens"]
    assert r.n_chunks == gold["n_chunks"]
    assert r.scored_per_chunk == gold["scored_per_chunk"]
    assert r.ppl == pytest.approx(gold["ppl"], rel=5e-3)
    np.testing.assert_allclose(r.running_ppl, gold["running_ppl"], rtol=5e-3)


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_perplexity_in_llamacpp_numerics_is_llamacpps(smollm2_path, fixtures_dir):
    """llama.cpp's logits (numerics="llamacpp") scored as its tool scores them (the sum
    of exponentials in double): its perplexity to float rounding, chunk by chunk."""
    import llamay

    d = fixtures_dir / "llamacpp" / "perplexity"
    gold = json.loads((d / "smollm2-135m-instruct-q4_1.GPL-3.ctx512.json").read_text())
    m = llamay.load(smollm2_path, numerics="llamacpp")
    r = perplexity(m, (d / gold["text"]).read_text(), ctx=gold["n_ctx"], batch=4)
    np.testing.assert_allclose(r.running_ppl, gold["running_ppl"], rtol=1e-7)
