"""`llamay eval perplexity` in-process through Typer's runner."""

from __future__ import annotations

import json

import jax
import pytest
from fixture_data import tiny_model_file
from typer.testing import CliRunner

from llamay.eval import perplexity
from llamay_cli.main import app

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("ppl") / "text.txt"
    p.write_text(TEXT)
    return p


def run(*args):
    return CliRunner().invoke(app, ["eval", "perplexity", *map(str, args)])


def test_perplexity_json(tiny_llama_model, text_file):
    model = tiny_model_file("llama")
    res = run("-m", model, text_file, "--ctx", 64, "--batch", 2, "--chunks", 3, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    ref = perplexity(tiny_llama_model, TEXT, ctx=64, batch=2, max_chunks=3)
    assert out["ppl"] == pytest.approx(ref.ppl, rel=1e-5)
    assert out["n_chunks"] == 3 and len(out["running_ppl"]) == 3
    # the text output: llama.cpp's "[1]x,[2]y," line, then the final estimate
    res = run("-m", model, text_file, "--ctx", 64, "--batch", 2, "--chunks", 3)
    assert res.exit_code == 0, res.output
    want = "".join(f"[{i + 1}]{p:.4f}," for i, p in enumerate(ref.running_ppl))
    assert want in res.stdout.splitlines()


@pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 devices (XLA_FLAGS as `make test`)")
def test_perplexity_mesh_text_output(tiny_llama_model, text_file):
    model = tiny_model_file("llama")
    res = run(
        "-m", model, text_file, "--ctx", 64, "--batch", 2, "--chunks", 2, "--mesh", "dp=2,tp=2"
    )
    assert res.exit_code == 0, res.output
    ref = perplexity(tiny_llama_model, TEXT, ctx=64, batch=2, max_chunks=2)
    final = [line for line in res.stdout.splitlines() if line.startswith("Final estimate")]
    assert final, res.stdout
    # the sharded run's matmuls sum in another order than the unsharded native kernels'
    printed = float(final[0].split("PPL = ")[1].split()[0])
    assert printed == pytest.approx(ref.ppl, rel=1e-5)


def test_errors_exit_1(text_file):
    model = tiny_model_file("llama")
    res = run("-m", model, text_file, "--ctx", 100000)
    assert res.exit_code == 1 and "error:" in res.output
    res = run("-m", model, text_file, "--mesh", "pp=3")
    assert res.exit_code == 1 and "mesh" in res.output
    res = run("-m", "no-such-model:1b", text_file, "--ctx", 63)  # refused before loading
    assert res.exit_code == 1 and "even number" in res.output


def test_flash_attn_flag_reaches_the_model(text_file):
    """`-fa on` with llamacpp numerics is `llamay.load(..., flash_attn=True)` (whose values
    tests/model/test_flash_attn.py holds to llama.cpp's); a bad value is a clear error."""
    import llamay

    model = tiny_model_file("llama")
    args = ("-m", model, text_file, "--ctx", 128, "--chunks", 2, "--numerics", "llamacpp")
    res = run(*args, "-fa", "on", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    m = llamay.load(model, numerics="llamacpp", flash_attn=True)
    ref = perplexity(m, TEXT, ctx=128, max_chunks=2)
    assert out["flash_attn"] is True and out["running_ppl"] == pytest.approx(ref.running_ppl)
    off = json.loads(run(*args, "--json").stdout.strip().splitlines()[-1])
    assert off["flash_attn"] is False and off["ppl"] != out["ppl"]  # another rounding
    res = run(*args, "-fa", "maybe")
    assert res.exit_code == 1 and "flash_attn must be on, off or auto" in res.output
