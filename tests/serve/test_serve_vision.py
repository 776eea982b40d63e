"""Images over HTTP (issue 25): `llamay serve --mmproj` and OpenAI `image_url` content parts
(data URLs) through the official openai client over loopback, held to the library's
`Model.generate(images=)` (itself held to llama.cpp in tests/vision); http URLs refused.
Image requests run in the server's batching engine: a second request with the same image
takes the shared pages from its prefix tree (each API's cached-token count), another image
does not."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from conftest import chat_prompt, running
from fixture_data import fixture, oracle, tiny_model_file, vision_mmproj

import llamay
from llamay import multimodal
from llamay.serve import create_app
from llamay.serve.models import Models

PAGE = 16  # the server engine's page size (llamay.serve.models.make_engine)


def _png(name: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.load(fixture("vision", "images.npz"))[name]).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.load(fixture("vision", "images.npz"))["wide45x29"]).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vision_server(serve_home):
    models = Models(
        {"tiny": tiny_model_file("llama")},
        use_store=False,
        default_keep_alive=-1,
        mmproj=vision_mmproj("mlp"),
    )
    with running(create_app(models, max_tokens_limit=64)) as s:
        yield s


def test_openai_image_url_reaches_the_model(vision_server, png):
    openai = oracle("openai")
    client = openai.OpenAI(base_url=vision_server.url + "/v1", api_key="x")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [
        {"type": "text", "text": "What is in "},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "?"},
    ]
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0
    )
    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:
        prompt = chat_prompt(m, [{"role": "user", "content": "What is in <__media__>?"}])
        chs = multimodal.chunks(m.tokenizer, m.projector, prompt, [png])
        expect = m.generate(prompt, images=[png], max_tokens=4, temperature=0)
    assert r.choices[0].message.content == expect
    # the image's 16 embeddings are counted as prompt tokens, as llama-server counts them
    assert r.usage.prompt_tokens == multimodal.n_positions(chs)
    assert sum(len(c) for k, c in chs if k == "image") == 16
    assert r.usage.completion_tokens == 4 or r.choices[0].finish_reason == "stop"


def test_openai_http_image_urls_are_refused(vision_server):
    openai = oracle("openai")
    client = openai.OpenAI(base_url=vision_server.url + "/v1", api_key="x")
    parts = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with pytest.raises(openai.BadRequestError, match="not fetched"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=1
        )
    bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]
    with pytest.raises(openai.BadRequestError, match="not valid base64"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": bad}], max_tokens=1
        )


def test_images_without_a_projector_are_refused(server, png):
    """The shared tiny server has no --mmproj: a clear 400."""
    openai = oracle("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}]
    with pytest.raises(openai.BadRequestError, match="no vision projector"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=1
        )


def _library(prompt: str, png: bytes, n: int) -> tuple[str, int]:
    """What the library gives for the same prompt text and image (greedy), and the
    prompt's positions (text tokens plus the image's 16 embeddings)."""
    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:
        chs = multimodal.chunks(m.tokenizer, m.projector, prompt, [png])
        return m.generate(
            prompt, images=[png], max_tokens=n, temperature=0
        ), multimodal.n_positions(chs)


def test_ollama_images_reach_the_model(vision_server, png):
    ollama = oracle("ollama")
    client = ollama.Client(host=vision_server.url)
    b64 = base64.b64encode(png).decode()
    opts = {"temperature": 0, "num_predict": 4, "repeat_penalty": 1.0}
    r = client.chat(
        model="tiny",
        messages=[{"role": "user", "content": "What is it?", "images": [b64]}],
        options=opts,
    )
    with llamay.load(tiny_model_file("llama")) as m:
        prompt = chat_prompt(m, [{"role": "user", "content": "<__media__>What is it?"}])
    expect, n = _library(prompt, png, 4)
    assert r.message.content == expect
    assert r.prompt_eval_count == n
    g = client.generate(model="tiny", prompt="Look: <__media__> What is it?", images=[b64],
                        options=opts, raw=True)  # fmt: skip
    expect, n = _library("Look: <__media__> What is it?", png, 4)
    assert g.response == expect and g.prompt_eval_count == n


def test_anthropic_image_blocks_reach_the_model(vision_server, png):
    anthropic = oracle("anthropic")
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="x")
    b64 = base64.b64encode(png).decode()
    content = [
        {"type": "text", "text": "What is in "},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": "?"},
    ]
    r = client.messages.create(
        model="tiny",
        max_tokens=4,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": content}],
    )
    with llamay.load(tiny_model_file("llama")) as m:
        prompt = chat_prompt(m, [{"role": "user", "content": "What is in <__media__>?"}])
    expect, n = _library(prompt, png, 4)
    assert r.content[0].text == expect
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == n
    # count_tokens counts the image's tokens as the message did
    msgs = [{"role": "user", "content": content}]
    assert client.messages.count_tokens(model="tiny", messages=msgs).input_tokens == n
    url = {"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}}
    with pytest.raises(anthropic.BadRequestError, match="not fetched"):
        client.messages.create(
            model="tiny", max_tokens=1, messages=[{"role": "user", "content": [url]}]
        )


def test_llamaserver_completion_multimodal_data(vision_server, png):
    """llama-server's /completion with {prompt_string, multimodal_data}: the golden prompt,
    so the first greedy token is llama.cpp's own (a 0.77 margin: exact numerics agree)."""
    httpx = oracle("httpx")
    g = np.load(fixture("vision", "mlp.llamacpp.npz"))
    body = {
        "prompt": {
            "prompt_string": str(g["prompt"]),
            "multimodal_data": [base64.b64encode(png).decode()],
        },
        "n_predict": 1,
        "temperature": 0,
    }
    r = httpx.post(vision_server.url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    with llamay.load(tiny_model_file("llama")) as m:
        assert out["content"] == m.detokenize([int(g["top_ids_wide45x29"][0])])
    assert out["tokens_evaluated"] == len(g["tokens_wide45x29"])


def test_same_image_reuses_the_cached_prefix(vision_server, png):
    """A second /completion with the same image and prompt start takes the K/V up to the
    image from the prefix cache (llama-server's timings.cache_n), with the same answer;
    another image misses it."""
    httpx = oracle("httpx")
    b64 = base64.b64encode(png).decode()

    def ask(text: str, image: str) -> dict:
        body = {
            "prompt": {"prompt_string": text, "multimodal_data": [image]},
            "n_predict": 3,
            "temperature": 0,
        }
        r = httpx.post(vision_server.url + "/completion", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    first = ask("Cached: <__media__> one", b64)
    second = ask("Cached: <__media__> two", b64)
    # "Cached: " and the image's 16 embeddings: what the two prompts share, in whole pages
    with llamay.load(tiny_model_file("llama")) as m:
        n_text = len(m.tokenize("Cached: ", add_special=True, parse_special=True))
    shared = (n_text + 16) // PAGE * PAGE
    assert first["timings"]["cache_n"] == 0
    assert second["timings"]["cache_n"] == shared > n_text  # image positions among them
    again = ask("Cached: <__media__> one", b64)
    assert again["content"] == first["content"] and again["timings"]["cache_n"] >= shared
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.load(fixture("vision", "images.npz"))["square32"]).save(buf, format="PNG")
    other = ask("Cached: <__media__> one", base64.b64encode(buf.getvalue()).decode())
    assert other["timings"]["cache_n"] == 0


def _ask(url: str, text: str, image: str, n: int, **body) -> dict:
    """llama-server's /completion of one image prompt, greedy."""
    httpx = oracle("httpx")
    body = {
        "prompt": {"prompt_string": text, "multimodal_data": [image]},
        "n_predict": n,
        "temperature": 0,
        **body,
    }
    r = httpx.post(url + "/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_predict_0_evaluates_an_image_prompt_into_the_cache(vision_server, png):
    """llama-server's n_predict 0 ("no tokens will be generated but the prompt is evaluated
    into the cache") with an image: nothing generated, every position evaluated, and the next
    request with the same image takes the image's pages from the cache and answers what the
    library (held to llama.cpp in tests/vision) answers."""
    b64 = base64.b64encode(png).decode()
    text = "Evaluate: <__media__> then"
    out = _ask(vision_server.url, text, b64, 0)
    expect, n = _library(text, png, 3)
    assert (out["content"], out["tokens_predicted"], out["tokens_evaluated"]) == ("", 0, n)
    assert out["timings"]["prompt_n"] == n and out["timings"]["cache_n"] == 0
    assert out["tokens_cached"] == n  # llama-server's: what the slot holds, the whole prompt
    with llamay.load(tiny_model_file("llama")) as m:
        n_text = len(m.tokenize("Evaluate: ", add_special=True, parse_special=True))
    again = _ask(vision_server.url, text, b64, 3)
    assert again["timings"]["cache_n"] == (n - 1) // PAGE * PAGE > n_text + 16 - PAGE
    assert again["content"] == expect


def test_slot_save_and_restore_keep_an_images_kv(vision_server, png, tmp_path):
    """/slots/{id}?action=save after an image request writes the image's K/V too (its
    positions keyed by the image's content); restored into a fresh server, a request with
    that image reuses them (timings.cache_n past the image) and answers as the first run
    did, with the same log-probabilities."""
    b64 = base64.b64encode(png).decode()
    text, httpx = "Saved: <__media__> it is", oracle("httpx")
    vision_server.app.state.llamay.extra["slot_save_path"] = str(tmp_path)
    try:
        first = _ask(vision_server.url, text, b64, 3, id_slot=0, n_probs=4)
        r = httpx.post(
            vision_server.url + "/slots/0?action=save", json={"filename": "img.bin"}, timeout=120
        )
        assert r.status_code == 200, r.text
    finally:
        vision_server.app.state.llamay.extra.pop("slot_save_path")
    models = Models(
        {"tiny": tiny_model_file("llama")}, use_store=False, mmproj=vision_mmproj("mlp")
    )
    app = create_app(models, max_tokens_limit=64)
    app.state.llamay.extra["slot_save_path"] = str(tmp_path)
    with running(app) as s:
        r = httpx.post(s.url + "/slots/0?action=restore", json={"filename": "img.bin"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == first["tokens_evaluated"] + 3
        r = httpx.post(s.url + "/slots/0?action=save", json={"filename": "again.bin"}, timeout=60)
        assert r.status_code == 400 and "not the images" in r.text  # only its K/V came back
        again = _ask(s.url, text, b64, 3, n_probs=4)
    with llamay.load(tiny_model_file("llama")) as m:
        n_text = len(m.tokenize("Saved: ", add_special=True, parse_special=True))
    assert again["timings"]["cache_n"] >= (n_text + 16) // PAGE * PAGE > n_text
    assert again["content"] == first["content"]
    for a, b in zip(
        again["completion_probabilities"], first["completion_probabilities"], strict=True
    ):
        assert a["id"] == b["id"]
        np.testing.assert_allclose(a["logprob"], b["logprob"], atol=1e-5)


def test_contexts_refuse_images_clearly(vision_server, png):
    """The context API keeps token ids only: a message with an image part is refused with
    a 400 that says so (a template would render the part as text, without the image)."""
    httpx = oracle("httpx")
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    parts = [{"type": "text", "text": "What is "}, {"type": "image_url", "image_url": {"url": url}}]
    r = httpx.post(
        vision_server.url + "/v1/contexts",
        json={"model": "tiny", "messages": [{"role": "user", "content": parts}]},
        timeout=60,
    )
    assert r.status_code == 400 and "contexts take text only" in r.text, r.text
    r = httpx.post(
        vision_server.url + "/v1/contexts", json={"model": "tiny", "text": "Hi"}, timeout=300
    )
    assert r.status_code == 200, r.text
    cid = r.json()["id"]
    r = httpx.post(
        f"{vision_server.url}/v1/contexts/{cid}/append",
        json={"messages": [{"role": "user", "content": parts}]},
        timeout=60,
    )
    assert r.status_code == 400 and "'image_url' parts" in r.text, r.text
    assert httpx.get(f"{vision_server.url}/v1/contexts/{cid}").json()["n_tokens"] > 0


def test_serve_cli_mmproj_flag(monkeypatch, tmp_path):
    """`llamay serve -m MODEL --mmproj FILE` gives the model its projector; without a model
    the flag is an error that says why."""
    import uvicorn
    from typer.testing import CliRunner

    from llamay_cli.main import app

    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path))
    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, *a, **k: served.append(app_))
    monkeypatch.setattr(
        "llamay.serve.app.run_server", lambda app_, *a, **k: served.append(app_), raising=False
    )
    mmproj = str(vision_mmproj("mlp"))
    model = str(tiny_model_file("llama"))
    r = CliRunner().invoke(app, ["serve", "--no-store", "-m", model, "--mmproj", mmproj])
    assert r.exit_code == 0, r.output
    [server] = served
    models = server.state.llamay.models
    assert models.mmproj == vision_mmproj("mlp")
    r = CliRunner().invoke(app, ["serve", "--no-store", "--mmproj", mmproj])
    assert r.exit_code != 0 and "--mmproj" in r.output


def test_store_model_with_a_projector_layer_takes_images(tmp_path, monkeypatch, png):
    """A store model whose manifest has a `projector` layer (here made by `llamay create`
    FROM an Ollama-layout vision model) reads images over HTTP without --mmproj."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ollama"))
    import json

    from ollama_layout import OllamaLayout, go_json

    from llamay import library
    from llamay.store import manifest as media

    layout = OllamaLayout(tmp_path / "ollama")
    path = layout.model(("registry.ollama.ai", "library", "tv", "latest"), tiny_model_file("llama"))
    man = json.loads(path.read_bytes())
    man["layers"].append(layout.blob(vision_mmproj("mlp").read_bytes(), media.PROJECTOR))
    path.write_bytes(go_json(man))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "home"))
    library.create("vis:1", "FROM tv\n", progress=False)
    openai = oracle("openai")
    models = Models({}, use_store=True, default_keep_alive=-1)
    with running(create_app(models, max_tokens_limit=8)) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x")
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        parts = [{"type": "image_url", "image_url": {"url": url}}]
        r = client.chat.completions.create(
            model="vis:1",
            messages=[{"role": "user", "content": parts}],
            max_tokens=2,
            temperature=0,
        )
    with llamay.load(tiny_model_file("llama")) as m:
        prompt = chat_prompt(m, [{"role": "user", "content": "<__media__>"}])
    expect, n = _library(prompt, png, 2)
    assert r.choices[0].message.content == expect and r.usage.prompt_tokens == n


def test_each_api_reuses_an_images_cached_prefix(vision_server, png):
    """A chat's next request about the same image, through each official client, takes
    the shared pages (image positions included) from the engine's prefix tree and counts
    them (OpenAI cached_tokens, Anthropic cache_read_input_tokens, the server's prefix-cache
    counter for Ollama, which reports none); a request with another image at the same
    place reuses nothing of the image."""
    openai, anthropic, ollama = oracle("openai"), oracle("anthropic"), oracle("ollama")
    httpx = oracle("httpx")
    other = _png("tall20x50")

    def b64(img):
        return base64.b64encode(img).decode()

    def parts(text, img, image_part):
        before, _, after = text.partition("<__media__>")
        return [
            {"type": "text", "text": before},
            image_part(img),
            {"type": "text", "text": after},
        ]

    client = openai.OpenAI(base_url=vision_server.url + "/v1", api_key="x")

    def ask_openai(text, img):
        url = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(img)}}
        msg = {"role": "user", "content": parts(text, img, lambda _: url)}
        r = client.chat.completions.create(
            model="tiny", messages=[msg], max_tokens=2, temperature=0
        )
        return r.usage.prompt_tokens_details.cached_tokens

    aclient = anthropic.Anthropic(base_url=vision_server.url, api_key="x")

    def ask_anthropic(text, img):
        source = {"type": "base64", "media_type": "image/png", "data": b64(img)}
        block = {"type": "image", "source": source}
        r = aclient.messages.create(
            model="tiny",
            max_tokens=2,
            extra_body={"temperature": 0},
            messages=[{"role": "user", "content": parts(text, img, lambda _: block)}],
        )
        return r.usage.cache_read_input_tokens

    oclient = ollama.Client(host=vision_server.url)

    def hits() -> float:
        body = httpx.get(vision_server.url + "/metrics", timeout=30).text
        line = next(x for x in body.splitlines() if x.startswith("llamay_prefix_cache_hit"))
        return float(line.split()[-1])

    def ask_ollama(text, img):  # the rendered chat prompt, raw
        before = hits()
        r = oclient.generate(
            model="tiny",
            prompt=chat(text),
            images=[b64(img)],
            raw=True,
            options={"temperature": 0, "num_predict": 2},
        )
        assert r.prompt_eval_count == len(layout(text, img).ids)  # cached ones included
        return hits() - before

    with llamay.load(tiny_model_file("llama"), mmproj=vision_mmproj("mlp")) as m:

        def chat(text):
            return chat_prompt(m, [{"role": "user", "content": text}])

        def layout(text, img):
            return multimodal.layout(m.tokenizer, m.projector, chat(text), [img])

        def expected(first, second, img):
            """The second prompt's cached tokens after the first (with `png`): their
            shared prefix in whole pages; and where its image starts."""
            a, b = layout(first, png), layout(second, img)
            common = 0
            while common < min(len(a.ids), len(b.ids)) and a.ids[common] == b.ids[common]:
                common += 1
            return min(common, len(b.ids) - 1) // PAGE * PAGE, b.images[0].start

        for api, ask in (("OpenAI", ask_openai), ("Claude", ask_anthropic), ("Ollama", ask_ollama)):
            first = f"{api}, say what <__media__> shows."
            second = f"{api}, say what <__media__> shows, briefly."
            want, start = expected(first, second, png)
            assert want > start, api  # the shared pages reach into the image
            assert ask(first, png) <= start, api  # the template's text pages, at most
            assert ask(second, png) == want, api
            assert ask(second, other) <= expected(first, second, other)[1], api


def test_structured_output_and_tools_with_images(vision_server, png):
    """JSON schemas and forced tool calls constrain image requests as any other (the
    engine applies the constraint's masks to the image request's rows): OpenAI
    response_format, Ollama format, Anthropic forced tool, llama-server json_schema."""
    import json

    openai, anthropic, ollama = oracle("openai"), oracle("anthropic"), oracle("ollama")
    httpx = oracle("httpx")
    schema = {
        "type": "object",
        "properties": {"animal": {"enum": ["cat", "dog"]}},
        "required": ["animal"],
        "additionalProperties": False,
    }
    b64 = base64.b64encode(png).decode()

    def ok(obj) -> None:
        assert obj in ({"animal": "cat"}, {"animal": "dog"}), obj

    client = openai.OpenAI(base_url=vision_server.url + "/v1", api_key="x")
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
        {"type": "text", "text": "Which animal?"},
    ]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    r = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": parts}],
        max_tokens=32,
        temperature=0,
        response_format=fmt,
    )
    ok(json.loads(r.choices[0].message.content))

    o = ollama.Client(host=vision_server.url).chat(
        model="tiny",
        messages=[{"role": "user", "content": "Which animal?", "images": [b64]}],
        format=schema,
        options={"temperature": 0, "num_predict": 32},
    )
    ok(json.loads(o.message.content))

    tool = {"name": "say", "description": "Name the animal", "input_schema": schema}
    source = {"type": "base64", "media_type": "image/png", "data": b64}
    # greedy, as every request here: Anthropic's default temperature (1) sometimes spends
    # the 32 tokens before the call's JSON closes (stop_reason max_tokens, input {})
    a = anthropic.Anthropic(base_url=vision_server.url, api_key="x").messages.create(
        model="tiny",
        max_tokens=32,
        extra_body={"temperature": 0},  # (this client's create() has no temperature)
        tools=[tool],
        tool_choice={"type": "tool", "name": "say"},
        messages=[{"role": "user", "content": [{"type": "image", "source": source}]}],
    )
    [use] = [b for b in a.content if b.type == "tool_use"]
    assert use.name == "say"
    ok(use.input)

    body = {
        "prompt": {"prompt_string": "<__media__> Which animal?", "multimodal_data": [b64]},
        "n_predict": 32,
        "temperature": 0,
        "json_schema": schema,
    }
    c = httpx.post(vision_server.url + "/completion", json=body, timeout=120)
    assert c.status_code == 200, c.text
    ok(json.loads(c.json()["content"]))
