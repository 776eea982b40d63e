"""numerics="llamacpp" with flash_attn=True against llama.cpp's own flash attention (-fa on,
its tools' default) over an F16 cache: tests/fixtures/flash-attn (make_flash_attn.py there:
llama-cpp-python 0.3.36, 2 threads) and the perplexity goldens (`*.fa.json`).

Each model has three runs, one per path of ggml's flash attention (a 5-token prompt: one
pass per row; 131 tokens: the tiled path; 568: a 512-token ubatch tiled, 56 tokens one pass
a row, then decoding over n_kv >= 512 cells: the split path, by llama.cpp's 2 threads).
Measured: every probed logit equal to llama.cpp's (0 difference) and every generated
position's top-10 log-probabilities within 2e-6 (f32 rounding of the log-softmax) for the
tiny llama, qwen3, gemma3, phi3 and both real models; flash attention off moves them by
0.1-0.2, one thread instead of two the split path's by 1.2. The tiny gemma2 takes its attention
softcap's tanh from XLA (no libm's tanhf to reproduce): within 0.03 there.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from fixture_data import fixture, tiny_model_file

import llamay
from llamay import kernels
from llamay.engine.api import Request
from llamay.eval import perplexity
from llamay.sample import GREEDY, Sampler

PROBE_TOL = {"gemma2": 0.05}  # else 2e-6: the probes measured equal
LOGPROB_TOL = {"gemma2": 0.05}  # else 1e-5: measured <= 2e-6
TINY = ["llama", "qwen3", "gemma3", "phi3", "gemma2"]


def goldens() -> dict:
    return json.loads(fixture("flash-attn", "flash-attn.json").read_text())


def load(path, threads: int = 2):
    return llamay.load(path, numerics="llamacpp", flash_attn=True, ggml_threads=threads,
                       n_ctx=1024)  # fmt: skip


def logprob_error(tops, run) -> float:
    """The largest deviation of the top log-probabilities `tops` (per generated position,
    [(id, logprob)]) from llama.cpp's (its logits minus their log-sum-exp)."""
    worst = 0.0
    rows = zip(tops, run["generated_top10_ids"], run["generated_top10_logits"],
               run["generated_lse"], strict=False)  # fmt: skip
    for top, ids, logits, lse in rows:
        mine = dict(top)
        near = [abs(mine[i] - (x - lse)) for i, x in zip(ids, logits, strict=True) if i in mine]
        worst = max([worst, *near])
    return worst


def generated_logprob_error(m, run) -> tuple[list[int], float]:
    """The greedy continuation (`Model.generation`) and its `logprob_error`."""
    gen = m.generation(
        run["prompt_ids"], len(run["greedy_ids"]), Sampler(temperature=0, n_probs=10)
    )
    got = list(gen)
    return got, logprob_error([top for _, top in gen.logprobs], run)


def check_run(m, run, probe_tol: float, logprob_tol: float, name: str):
    ids = run["prompt_ids"]
    # one step of at most 512 tokens: llama.cpp's first ubatch (so the probes before 512)
    logits = m.logits(ids[:512])
    for p, top, want in zip(run["probe_positions"], run["probe_top10_ids"],
                            run["probe_top10_logits"], strict=True):  # fmt: skip
        if p < 512:
            np.testing.assert_allclose(
                logits[p][top], want, rtol=0, atol=probe_tol, err_msg=f"{name} @{p}"
            )
    got, worst = generated_logprob_error(m, run)
    print(f"{name}: {len(ids)}-token prompt, {len(got)} tokens, logprob max |d| {worst:.2e}")
    assert got == run["greedy_ids"][: len(got)] and len(run["greedy_ids"]) - len(got) <= 1
    assert worst <= logprob_tol


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_equal_llamacpp_flash_attention(name):
    m = load(tiny_model_file(name))
    for run_name, run in goldens()["models"][f"tiny-{name}"]["runs"].items():
        check_run(
            m, run, PROBE_TOL.get(name, 2e-6), LOGPROB_TOL.get(name, 1e-5), f"{name} {run_name}"
        )


def test_encoder_states_equal_llamacpp_flash_attention():
    """The tiny bert (non-causal, no KV cache in llama.cpp, whose flash attention takes its
    f32 K and V cast to f16): per-token states of a 10-token text (one pass a row) and a
    105-token one (tiled) within 2e-6 (measured 4.8e-7; flash attention off: 0.023)."""
    m = llamay.load(tiny_model_file("bert"), numerics="llamacpp", flash_attn=True)
    for name, run in goldens()["encoders"]["tiny-bert"]["runs"].items():
        got = m.embed(run["ids"], pooling="none")
        np.testing.assert_allclose(got, run["states"], rtol=0, atol=2e-6, err_msg=name)


@pytest.mark.model
def test_the_engine_equals_llamacpp(smollm2_path):
    """Through the batch engine (`Model.generate`'s and the server's: the paged pool read in
    place, prefill in ubatches of 512, decoding over >= 512 cells on the split path):
    llama.cpp's greedy continuation of the 568-token prompt and its log-probabilities
    (measured within 4e-7; flash attention off gives the same tokens, 0.48 off)."""
    run = goldens()["models"]["smollm2"]["runs"]["split"]
    m = load(smollm2_path)
    n = len(run["greedy_ids"])
    h = m.engine.submit(Request(run["prompt_ids"], max_tokens=n, sampler=GREEDY, logprobs=10))
    events = list(h)
    assert [e.token_id for e in events] == run["greedy_ids"][: len(events)]
    worst = logprob_error([e.top_logprobs for e in events], run)
    print(f"engine: {len(events)} tokens, logprob max |d| {worst:.2e}")
    assert worst <= 1e-5
    m.close()


def test_the_split_path_rounds_by_llamacpps_thread_count():
    """Decoding over >= 512 cells splits them by thread: the 2-thread goldens differ from
    a 1-thread reproduction (which is one pass per row) by far more than rounding noise."""
    run = goldens()["models"]["tiny-llama"]["runs"]["split"]
    _, worst = generated_logprob_error(load(tiny_model_file("llama"), threads=1), run)
    assert worst > 1e-3


def test_the_emulation_equals_llamacpp_flash_attention(monkeypatch):
    """The XLA emulation itself (what GPUs/TPUs run; on CPU the native kernel, its bit-for-bit
    twin, tested in tests/kernels_cpu): the tiny qwen3's three paths."""
    monkeypatch.setenv(kernels.ENV, "reference")
    jax.clear_caches()
    m = load(tiny_model_file("qwen3"))
    for run_name, run in goldens()["models"]["tiny-qwen3"]["runs"].items():
        check_run(m, run, 2e-6, 1e-5, f"qwen3 emulated {run_name}")
    jax.clear_caches()


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_models_equal_llamacpp_flash_attention(model, smollm2_path, gemma3_path):
    m = load(smollm2_path if model == "smollm2" else gemma3_path)
    for run_name, run in goldens()["models"][model]["runs"].items():
        check_run(m, run, 2e-6, 1e-5, f"{model} {run_name}")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"])
def test_perplexity_equals_llamacpps_with_flash_attention(model, smollm2_path, gemma3_path):
    """llama.cpp's perplexity over GPL-3 at ctx 512 with flash attention on, chunk by chunk
    (measured: within 1.4e-8 relative, the sum of exponentials' rounding)."""
    d = fixture("llamacpp", "perplexity")
    gold = json.loads((d / f"{model}.GPL-3.ctx512.fa.json").read_text())
    m = load(smollm2_path if model.startswith("smollm2") else gemma3_path)
    r = perplexity(m, (d / gold["text"]).read_text(), ctx=gold["n_ctx"], batch=4)
    np.testing.assert_allclose(r.running_ppl, gold["running_ppl"], rtol=1e-7)
