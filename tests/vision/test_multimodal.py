"""Images in the token stream (llamay.multimodal) against llama.cpp's mtmd: the prompt's
layout (mtmd_tokenize's tokens) and the logits after an image prompt, run through the
batching engine (each image's embeddings in place of its placeholder ids; gemma3's image a
non-causal step of its own, as mtmd_helper_eval_chunks decodes it), its prefix tree keyed by
the image's content (tests/fixtures/vision/README.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fixture_data import fixture, tiny_model_file, vision_mmproj

import llamay
from llamay import multimodal
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine
from llamay.errors import ImageError, ProjectorError, RequestError
from llamay.sample import Sampler
from llamay.vision import Projector

GREEDY = Sampler(temperature=0)

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
    m = llamay.load(tiny_model_file(PAIRS[kind]), numerics="llamacpp", mmproj=vision_mmproj(kind))
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


def _top(engine, prompt, n_top=32, max_tokens=1, spans=None):
    """(tokens, [{id: logprob}] per token, usage) of a greedy engine request over an
    `ImagePrompt` (`spans`: its images replaced)."""
    images = prompt.images if spans is None else spans
    req = Request(prompt.ids, max_tokens, GREEDY, logprobs=n_top, images=images)
    h = engine.submit(req)
    evs = list(h)
    return [e.token_id for e in evs], [dict(e.top_logprobs) for e in evs], h.usage


def _error(top: dict, golden, name: str) -> float:
    """The largest difference between the engine's log-probabilities and llama.cpp's
    (its top logits less its log-sum-exp) over llama.cpp's top ids."""
    ids = golden[f"top_ids_{name}"]
    ref = golden[f"top_logits_{name}"] - float(golden[f"lse_{name}"])
    got = np.array([top.get(int(i), -np.inf) for i in ids])
    return float(np.abs(got - ref).max())


@pytest.mark.parametrize("name", IMAGES)
def test_logits_after_image_prompt_equal_llamacpp(model, golden, images, kind, name):
    """Through the engine: the log-probabilities after the image prompt (llama.cpp's top
    logits less its log-sum-exp) and the greedy token, as llama.cpp computes them."""
    p = multimodal.layout(model.tokenizer, model.projector, str(golden["prompt"]), [images[name]])
    assert len(p.ids) == len(golden[f"tokens_{name}"])
    toks, tops, usage = _top(model.engine, p)
    assert usage.prompt_tokens == len(p.ids)
    assert _error(tops[0], golden, name) < TOL[kind]
    ref = golden[f"top_logits_{name}"]
    if ref[0] - ref[1] > TOL[kind]:
        assert toks[0] == int(golden[f"top_ids_{name}"][0])


def test_gemma3_image_equals_llamacpp_bit_for_bit(images):
    """The Gemma 3 pair's log-probabilities equal llama.cpp's to float rounding (the
    engine's paged, batched path computes what mtmd's chunk-by-chunk decode does)."""
    g = np.load(fixture("vision", "gemma3.llamacpp.npz"))
    mmproj = vision_mmproj("gemma3")
    with llamay.load(tiny_model_file("gemma3"), numerics="llamacpp", mmproj=mmproj) as m:
        for name in IMAGES:
            p = multimodal.layout(m.tokenizer, m.projector, str(g["prompt"]), [images[name]])
            assert _error(_top(m.engine, p)[1][0], g, name) < 1e-5


def test_gemma3_image_attends_non_causally(images):
    """mtmd decodes gemma3's image tokens with causal attention off; the causal variant's
    log-probabilities are measurably further from llama.cpp's, so the test above checks
    that path."""
    g = np.load(fixture("vision", "gemma3.llamacpp.npz"))
    mmproj = vision_mmproj("gemma3")
    with llamay.load(tiny_model_file("gemma3"), numerics="llamacpp", mmproj=mmproj) as m:
        p = multimodal.layout(m.tokenizer, m.projector, str(g["prompt"]), [images["square32"]])
        assert all(s.bidirectional for s in p.images)
        causal = tuple(dataclasses.replace(s, bidirectional=False) for s in p.images)
        err_ok = _error(_top(m.engine, p)[1][0], g, "square32")
        m.close()  # a fresh engine: the prefix tree holds the non-causal image's K/V
        err_causal = _error(_top(m.engine, p, spans=causal)[1][0], g, "square32")
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
    greedy token is llama.cpp's top logit after the image prompt; structured output
    constrains an image request as any other."""
    g = np.load(fixture("vision", "mlp.llamacpp.npz"))
    mmproj = vision_mmproj("mlp")
    with llamay.load(tiny_model_file("llama"), numerics="llamacpp", mmproj=mmproj) as m:
        assert m.projector is not None and m.projector.kind == "mlp"
        text = m.generate(
            str(g["prompt"]), images=[images["wide45x29"]], max_tokens=3, temperature=0
        )
        assert m.tokenize(text, add_special=False)[0] == int(g["top_ids_wide45x29"][0])
        with pytest.raises(ImageError, match="1 <__media__> markers for 0 images"):
            m.generate("a <__media__>", images=[], max_tokens=1)
        out = m.generate(
            str(g["prompt"]), images=[images["wide45x29"]], choices=["cat", "dog"], temperature=0
        )
        assert out in ("cat", "dog")


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


def test_cli_run_with_image(images, tmp_path, monkeypatch):
    """`llamay run MODEL --image IMG` (`--mmproj` for a GGUF without a projector layer):
    raw, on the golden prompt, the first greedy token is llama.cpp's (as `generate`'s);
    without markers the image goes before the message, through the chat template."""
    from PIL import Image
    from typer.testing import CliRunner

    from llamay_cli.main import app

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    g = np.load(fixture("vision", "mlp.llamacpp.npz"))
    png = tmp_path / "wide.png"
    Image.fromarray(images["wide45x29"]).save(png)
    model, mmproj = str(tiny_model_file("llama")), str(vision_mmproj("mlp"))
    args = ["run", model, "-n", "1", "--temperature", "0", "--mmproj", mmproj, "--image", str(png)]
    r = CliRunner().invoke(app, [*args, "--raw", str(g["prompt"])])
    assert r.exit_code == 0, r.output
    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:
        assert r.stdout == m.detokenize([int(g["top_ids_wide45x29"][0])]) + "\n"
        r = CliRunner().invoke(app, [*args[:3], "3", *args[4:], "What is it?"])
        assert r.exit_code == 0, r.output
        text = m.tokenizer.apply_chat_template(
            [{"role": "user", "content": "<__media__>What is it?"}]
        )
        expect = m.generate(text, images=[png.read_bytes()], max_tokens=3, temperature=0)
    assert r.stdout == expect + "\n"
    r = CliRunner().invoke(app, ["run", model, "--image", str(png), "hi"])
    assert r.exit_code != 0 and "no vision projector" in r.output


def test_prefix_cache_is_keyed_by_image_content(images):
    """The engine's prefix tree keys an image's positions by its content: a second request
    with the same image reuses the cached pages (counted in cached_tokens) and gets what a
    fresh engine computes; another image at the same place shares nothing."""
    mmproj = vision_mmproj("gemma3")
    with llamay.load(tiny_model_file("gemma3"), numerics="llamacpp", mmproj=mmproj) as m:
        ps = m.engine.page_size

        def prompt(img, tail, head="A "):
            return multimodal.layout(m.tokenizer, m.projector, head + "<__media__>" + tail, [img])

        # a text start after which the second page boundary cuts the image (the tiny
        # gemma3's window is 8: a hit ending at the first boundary would need local pages
        # that the first request released as it went on)
        for k in range(1, 4 * ps):
            im = prompt(images["wide45x29"], "", "A " * k).images[0]
            if im.start < 2 * ps < im.end:
                break
        head = "A " * k
        a = prompt(images["wide45x29"], " is a picture of the sea", head)
        b = prompt(images["wide45x29"], " is a house", head)
        c = prompt(images["square32"], " is a house", head)
        end = a.images[0].end  # the text start and the image: what a and b share
        assert a.ids[:end] == b.ids[:end] and b.ids[:end] != c.ids[:end]
        first = _top(m.engine, a, 8, 4)
        second = _top(m.engine, b, 8, 4)
        assert first[2].cached_tokens == 0
        # the shared pages end inside the image: its rest is fed (non-causally) again
        assert second[2].cached_tokens == 2 * ps
        other = _top(m.engine, c, 8, 4)
        assert other[2].cached_tokens <= c.images[0].start  # none of the image's positions
        m.close()  # a fresh engine, nothing cached
        fresh = _top(m.engine, b, 8, 4)
        assert fresh[2].cached_tokens == 0
        assert second[0] == fresh[0]
        for x, y in zip(second[1], fresh[1], strict=True):
            assert x.keys() == y.keys()
            np.testing.assert_allclose([x[k] for k in x], [y[k] for k in x], atol=1e-5)


@pytest.mark.parametrize("kind_", ["gemma3", "mlp"])
def test_image_and_text_requests_batched_each_equal_alone(images, kind_):
    """Two image requests (different images) and a text request in one batch each give
    what they give alone: tokens, and log-probabilities within float rounding."""
    mmproj = vision_mmproj(kind_)
    with llamay.load(tiny_model_file(PAIRS[kind_]), numerics="llamacpp", mmproj=mmproj) as m:
        g = np.load(fixture("vision", f"{kind_}.llamacpp.npz"))
        text = str(g["prompt"])
        reqs = [
            multimodal.layout(m.tokenizer, m.projector, text, [images["wide45x29"]]),
            multimodal.layout(m.tokenizer, m.projector, "<__media__> and", [images["tall20x50"]]),
            multimodal.ImagePrompt(
                m.tokenize("Once upon a time, there was", parse_special=True), ()
            ),
        ]
        alone = []
        for r in reqs:
            eng = BatchEngine(m, slots=4, prefix_cache=False)
            try:
                alone.append(_top(eng, r, 8, 5))
            finally:
                eng.close()
        eng = BatchEngine(m, slots=4, prefix_cache=False, gather_s=0.2)
        try:
            hs = [eng.submit(Request(r.ids, 5, GREEDY, logprobs=8, images=r.images)) for r in reqs]
            together = []
            for h in hs:
                evs = list(h)
                together.append(([e.token_id for e in evs], [dict(e.top_logprobs) for e in evs]))
            assert eng.stats()["steps"] < sum(len(t[0]) for t in together)  # they shared steps
        finally:
            eng.close()
    for (ta, la, _), (tb, lb) in zip(alone, together, strict=True):
        assert ta == tb
        for x, y in zip(la, lb, strict=True):
            assert x.keys() == y.keys()
            np.testing.assert_allclose([x[k] for k in x], [y[k] for k in x], atol=1e-5)


def test_bad_image_spans_are_refused(model, images):
    """An engine request whose images do not sit on placeholder positions, or are of
    another width, fails with a clear error."""
    p = multimodal.layout(model.tokenizer, model.projector, "a <__media__> b", [images["square32"]])
    im = p.images[0]
    bad = [
        (list(p.ids[: im.start]) + [1] * len(im.embeddings) + p.ids[im.end :], p.images),
        (p.ids, (dataclasses.replace(im, embeddings=im.embeddings[:, :3]),)),
        (p.ids, (dataclasses.replace(im, start=len(p.ids)),)),
    ]
    for ids, spans in bad:
        h = model.engine.submit(Request(ids, 1, GREEDY, images=spans))
        with pytest.raises(RequestError):
            list(h)


def test_chat_session_images(images, tmp_path, monkeypatch):
    """`llamay chat --mmproj`: `/image PATH` gives the next message an image (before its
    text, as Ollama places a message's images); the answer is Model.generate's for the
    conversation's template with the image there, and the next turn reuses the image's
    cached pages."""
    import builtins
    import io

    from PIL import Image

    from llamay.serve.models import make_engine
    from llamay_cli.serve_cmds import ChatSession, chat_loop

    png = tmp_path / "wide.png"
    Image.fromarray(images["wide45x29"]).save(png)
    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:
        engine = make_engine(m, 1)
        try:
            s = ChatSession(m, engine, GREEDY, 4)
            lines = iter([f"/image {png}", "What is it?", "And now?", "/bye"])
            monkeypatch.setattr(builtins, "input", lambda _: next(lines))
            out = io.StringIO()
            chat_loop(s, out)
            assert "image added to the next message" in out.getvalue()
            first = s.history[0]
            assert first == {"role": "user", "content": "<__media__>What is it?"}
            prompt = m.tokenizer.apply_chat_template(s.history[:1])
            assert s.history[1]["content"] == m.generate(
                prompt, images=[png.read_bytes()], max_tokens=4, temperature=0
            )
            assert engine.stats()["cache_hit_tokens"] > 16  # the second turn: the image too
            with pytest.raises(ValueError, match="cannot be saved"):
                s.save("x")
        finally:
            engine.close()
    with llamay.load(tiny_model_file("llama")) as m:
        with pytest.raises(ValueError, match="no vision projector"):
            ChatSession(m, None, GREEDY, 4).add_image(str(png))
