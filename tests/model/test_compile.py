"""Static shapes: prompts of new lengths inside one bucket reuse the compiled step."""

from __future__ import annotations

from fixture_data import tiny_model_file

import llamay
from llamay.engine.steps import decode_step, prefill_step
from llamay.model import logits_step
from llamay.sample import GREEDY


def test_new_length_in_same_bucket_does_not_recompile():
    m = llamay.load(tiny_model_file("llama"))
    for step in (prefill_step, decode_step, logits_step):
        step.clear_cache()  # other tests may have compiled these shapes already
    list(m.generation(list(range(100, 120)), max_tokens=3, sampler=GREEDY))  # bucket 32
    sizes = (prefill_step._cache_size(), decode_step._cache_size())
    list(m.generation(list(range(200, 227)), max_tokens=5, sampler=GREEDY))  # bucket 32 too
    assert (prefill_step._cache_size(), decode_step._cache_size()) == sizes
    m.logits(list(range(300, 320)))
    n = logits_step._cache_size()
    m.logits(list(range(300, 330)))
    assert logits_step._cache_size() == n
    list(m.generation(list(range(100, 140)), max_tokens=3, sampler=GREEDY))  # bucket 64
    assert prefill_step._cache_size() == sizes[0] + 1
