"""Images in the token stream (llamay.multimodal) against llama.cpp's mtmd: the prompt's
layout (mtmd_tokenize's tokens) and the logits after an image prompt, evaluated chunk by
chunk as mtmd_helper_eval_chunks does (tests/fixtures/vision/README.md)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import fixture, tiny_model_file, vision_mmproj

import llamay
from llamay import multimodal
from llamay.errors import ImageError, ProjectorError
from llamay.sample import Sampler
from llamay.vision import Projector

IMAGES = ("square32", "wide45x29", "tall20x50")
PAIRS = {"gemma3": "gemma3", "mlp": "llama"}
# tests/fixtures/tiny/README.md: llamacpp numerics vs llama.cpp, roughly 2-3x the "vs exact"
# column (llama 0.24, gemma3 0.45); here the image embeddings add their own ~1e-4.
TOL = {"gemma3": 1.0, "mlp": 0.5}


@pytest.fixture(scope="module")
def images():
    return dict(np.load(fixture("vision", "images.npz")))


@pytest.fixture(scope="module", params=sorted(PAIRS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def model(kind):
    m = llamay.load(tiny_model_file(PAIRS[kind]), numerics="llamacpp")
    yield m
    m.close()


@pytest.fixture(scope="module")
def projector(kind):
    return Projector.load(vision_mmproj(kind))


@pytest.fixture(scope="module")
def golden(kind):
    return np.load(fixture("vision", f"{kind}.llamacpp.npz"))


def _flat(chs):
    out = []
    for kind, c in chs:
        out += list(c) if kind == "text" else [-1] * len(c)
    return out


@pytest.mark.parametrize("name", IMAGES)
def test_prompt_layout_equals_mtmd(model, projector, golden, images, name):
    chs = multimodal.chunks(model.tokenizer, projector, str(golden["prompt"]), [images[name]])
    assert _flat(chs) == golden[f"tokens_{name}"].tolist()


@pytest.mark.parametrize("name", IMAGES)
def test_logits_after_image_prompt_equal_llamacpp(model, projector, golden, images, kind, name):
    chs = multimodal.chunks(model.tokenizer, projector, str(golden["prompt"]), [images[name]])
    logits, _, n = multimodal.prefill(
        model.config, model.weights, model.runtime.kv_dtype, chs, model.n_ctx
    )
    logits = np.asarray(logits, np.float64)
    assert n == len(golden[f"tokens_{name}"])
    ids, ref = golden[f"top_ids_{name}"], golden[f"top_logits_{name}"]
    np.testing.assert_allclose(logits[ids], ref, atol=TOL[kind])
    lse = logits.max() + np.log(np.exp(logits - logits.max()).sum())
    assert abs(lse - float(golden[f"lse_{name}"])) < TOL[kind]
    if ref[0] - ref[1] > TOL[kind]:
        assert int(np.argmax(logits)) == int(ids[0])


def test_gemma3_image_attends_non_causally(images):
    """mtmd decodes gemma3's image tokens with causal attention off; the causal variant's
    logits are measurably further from llama.cpp's, so the test above checks that path."""
    m = llamay.load(tiny_model_file("gemma3"), numerics="llamacpp")
    p = Projector.load(vision_mmproj("gemma3"))
    g = np.load(fixture("vision", "gemma3.llamacpp.npz"))
    chs = multimodal.chunks(m.tokenizer, p, str(g["prompt"]), [images["square32"]])
    a, _, _ = multimodal.prefill(m.config, m.weights, m.runtime.kv_dtype, chs, 256)
    saved = multimodal.NON_CAUSAL
    try:
        multimodal.NON_CAUSAL = frozenset()
        b, _, _ = multimodal.prefill(m.config, m.weights, m.runtime.kv_dtype, chs, 256)
    finally:
        multimodal.NON_CAUSAL = saved
        m.close()
    ids, ref = g["top_ids_square32"], g["top_logits_square32"]
    err_causal = np.abs(np.asarray(b)[ids] - ref).max()
    err_ok = np.abs(np.asarray(a)[ids] - ref).max()
    assert err_causal > 10 * max(err_ok, 1e-3), (err_causal, err_ok)


def test_marker_count_must_match_images(model, projector, images):
    with pytest.raises(ImageError, match="1 <__media__> markers for 2 images"):
        multimodal.chunks(model.tokenizer, projector, "a <__media__> b", [images["square32"]] * 2)


def test_idefics3_needs_its_marker_tokens(images):
    """SmolVLM's layout uses tokens the tiny SmolLM2 vocabulary lacks: a clear error."""
    m = llamay.load(tiny_model_file("llama"))
    try:
        p = Projector.load(vision_mmproj("idefics3"))
        with pytest.raises(ImageError, match="lacks '<fake_token_around_image>'"):
            multimodal.chunks(m.tokenizer, p, "x <__media__>", [images["square32"]])
    finally:
        m.close()


def test_load_with_mmproj_generates_from_an_image(images):
    """llamay.load(path, mmproj=...) and Model.generate(prompt, images=[...]): the first
    greedy token is llama.cpp's top logit after the image prompt."""
    g = np.load(fixture("vision", "mlp.llamacpp.npz"))
    mmproj = vision_mmproj("mlp")
    with llamay.load(tiny_model_file("llama"), numerics="llamacpp", mmproj=mmproj) as m:
        assert m.projector is not None and m.projector.kind == "mlp"
        ids = list(
            multimodal.generate_ids(
                m, str(g["prompt"]), [images["wide45x29"]], 3, Sampler(temperature=0)
            )
        )
        assert ids[0] == int(g["top_ids_wide45x29"][0])
        text = m.generate(
            str(g["prompt"]), images=[images["wide45x29"]], max_tokens=3, temperature=0
        )
        assert text == m.detokenize(ids)
        with pytest.raises(ImageError, match="1 <__media__> markers for 0 images"):
            m.generate("a <__media__>", images=[], max_tokens=1)


def test_images_need_a_projector_of_the_models_width(images):
    with llamay.load(tiny_model_file("llama")) as m:
        with pytest.raises(ImageError, match="no vision projector"):
            m.generate("<__media__>", images=[images["square32"]], max_tokens=1)
    with llamay.load(tiny_model_file("qwen3")) as m:  # width 256, the projector's 64
        with pytest.raises(ProjectorError, match="output width 64 is not this model's"):
            m.attach_projector(vision_mmproj("gemma3"))


def test_cli_generate_with_mmproj_and_image(images, tmp_path):
    """`llamay generate --mmproj FILE --image IMG`: a PNG read from disk, the prompt's
    marker, and the first greedy token llama.cpp's (a 0.77 margin: exact numerics agree)."""
    from PIL import Image
    from typer.testing import CliRunner

    from llamay_cli.main import app

    g = np.load(fixture("vision", "mlp.llamacpp.npz"))
    png = tmp_path / "wide.png"
    Image.fromarray(images["wide45x29"]).save(png)
    args = ["generate", "-m", str(tiny_model_file("llama")), "-n", "1", "--temperature", "0"]
    args += ["--mmproj", str(vision_mmproj("mlp")), "--image", str(png)]
    r = CliRunner().invoke(app, [*args, str(g["prompt"])])
    assert r.exit_code == 0, r.output
    with llamay.load(tiny_model_file("llama")) as m:
        expect = m.detokenize([int(g["top_ids_wide45x29"][0])])
    assert r.stdout == expect + "\n"
    r = CliRunner().invoke(
        app, ["generate", "-m", str(tiny_model_file("llama")), "--image", str(png), "hi"]
    )
    assert r.exit_code != 0 and "no vision projector" in r.output


def test_prefix_cache_is_keyed_by_image_content(images):
    """The K/V up to an image prompt's last image are reused for the same text and image
    (same logits), not for another image."""
    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:
        cache = multimodal.ImagePrefixCache()
        cfg, w, kvt = m.config, m.weights, m.runtime.kv_dtype

        def run(img, tail):
            chs = multimodal.chunks(m.tokenizer, m.projector, "A <__media__>" + tail, [img])
            logits, _, n, cached = multimodal.prefill_cached(cfg, w, kvt, chs, 256, 4, cache)
            fresh, _, _ = multimodal.prefill(cfg, w, kvt, chs, 256, 4)
            np.testing.assert_array_equal(np.asarray(logits), np.asarray(fresh))
            return cached, n

        a = run(images["wide45x29"], " b")
        assert a[0] == 0
        b = run(images["wide45x29"], " c d")
        assert b[0] == a[1] - 1 == b[1] - 2  # all but the tails: "A " and 16 embeddings
        assert run(images["square32"], " b")[0] == 0
