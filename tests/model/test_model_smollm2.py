"""SmolLM2-135M-Instruct Q4_1, exact numerics, against the transformers (float32 over the
dequantised weights) and llama.cpp goldens in tests/fixtures."""

from __future__ import annotations

import json

import numpy as np
import pytest

import llamay
from llamay.sample import GREEDY

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    return llamay.load(smollm2_path)


def goldens(fixtures_dir, kind):
    return json.loads((fixtures_dir / kind / "smollm2-135m-instruct-q4_1.json").read_text())


def greedy_ids(m, prompt_ids, n):
    """Greedy ids as the goldens record them: up to n tokens, the EOS included."""
    gen = m.generation(prompt_ids, max_tokens=n, sampler=GREEDY)
    out = list(gen)
    if gen.finish_reason == "stop":
        out.append(m.tokenizer.eos_id)
    return out


def test_greedy_continuations_equal_transformers(smollm2, fixtures_dir):
    for g in goldens(fixtures_dir, "transformers")["greedy"]:
        got = greedy_ids(smollm2, g["prompt_ids"], len(g["greedy_ids"]))
        assert got == g["greedy_ids"], g["prompt"]


def test_first_step_logits_equal_transformers(smollm2, fixtures_dir):
    for g in goldens(fixtures_dir, "transformers")["greedy"]:
        row = smollm2.logits(g["prompt_ids"])[-1]
        assert row.argmax() == g["first_top10_ids"][0]
        np.testing.assert_allclose(
            row[g["first_top10_ids"]], g["first_top10_logits"], atol=1e-3, err_msg=g["prompt"]
        )


def test_first_step_logits_near_llamacpp(smollm2, fixtures_dir):
    """llama.cpp rounds activations to int8 blocks: exact math is within 0.5 of it.

    One prompt ("The quick brown fox") is the exception, and not ours: the independent
    exact-math oracle (transformers) is itself 0.95 from llama.cpp there. So the bound is
    0.5, or transformers' own distance from llama.cpp where that is larger, and at most
    one prompt may need the larger bound.
    """
    exact = {g["prompt"]: g for g in goldens(fixtures_dir, "transformers")["greedy"]}
    widened = 0
    for g in goldens(fixtures_dir, "llamacpp")["greedy"]:
        ref = dict(zip(g["first_top10_ids"], g["first_top10_logits"], strict=True))
        tf = exact[g["prompt"]]
        tf_gap = max(
            abs(v - ref[i])
            for i, v in zip(tf["first_top10_ids"], tf["first_top10_logits"], strict=True)
            if i in ref
        )
        bound = max(0.5, tf_gap + 1e-3)
        widened += bound > 0.5
        row = smollm2.logits(g["prompt_ids"])[-1]
        np.testing.assert_allclose(
            row[g["first_top10_ids"]], g["first_top10_logits"], atol=bound, err_msg=g["prompt"]
        )
    assert widened <= 1


def test_prompt_ids_match_llamacpp_tokenisation(smollm2, fixtures_dir):
    """generate()'s prompt handling (special tokens parsed, BOS per metadata) is llama.cpp's."""
    for g in goldens(fixtures_dir, "llamacpp")["greedy"]:
        assert (
            smollm2.tokenize(g["prompt"], add_special=True, parse_special=True) == g["prompt_ids"]
        )


def test_generate_text_is_the_greedy_detokenisation(smollm2, fixtures_dir):
    g = goldens(fixtures_dir, "transformers")["greedy"][0]
    text = smollm2.generate(g["prompt"], max_tokens=12, temperature=0)
    assert text == smollm2.detokenize(g["greedy_ids"][:12])
    streamed = "".join(smollm2.generate(g["prompt"], max_tokens=12, temperature=0, stream=True))
    assert streamed == text
