"""LoRA adapters over HTTP, as llama-server serves them: `llamay serve --lora` adapters
listed by GET /lora-adapters, their global scales set by POST /lora-adapters, and the
per-request `lora` field of /completion, /v1/completions and /v1/chat/completions (the
official openai client's extra_body), on a real loopback server over the tiny llama with
tests/fixtures/lora's adapters; every answer equals the library's `load(lora=...)` with
only that setting, and requests with different adapters run in one batch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from fixture_data import FIXTURES, fixture_module, oracle

import llamay
from llamay.sample import GREEDY
from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import chat_prompt, running

LORA = FIXTURES / "lora"


@pytest.fixture(scope="module")
def adapters(tiny_paths, tmp_path_factory):
    oracle("gguf")
    mk = fixture_module("lora", "make_lora.py")
    paths = mk.write_adapters(tiny_paths["tiny"], "tiny-llama", tmp_path_factory.mktemp("lora"))
    gold = np.load(LORA / "tiny-llama.llamacpp.npz")
    for name, path in paths.items():
        assert mk.sha256(path) == str(gold[f"sha256_{name}"]), name
    return paths


@pytest.fixture(scope="module")
def ref(tiny_paths, adapters):
    """The library path: the tiny llama with both adapters (scale 1), `with_lora` per case."""
    return llamay.load(
        tiny_paths["tiny"], lora=[(adapters["wide"], 1.0), (adapters["narrow"], 1.0)]
    )


@pytest.fixture(scope="module")
def server(tiny_paths, adapters, serve_home):
    models = Models(
        {"tiny": tiny_paths["tiny"]},
        use_store=False,
        default_keep_alive=-1,
        parallel=4,
        lora=[(adapters["wide"], 1.0), (adapters["narrow"], 1.0)],
    )
    with running(create_app(models, max_tokens_limit=64)) as s:
        yield s


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


PROMPT = [1, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409]  # token ids: no template


def _tokens(ref, members, adapters, ids, n=8):
    m = ref.with_lora([(adapters[a], s) for a, s in members])
    out = list(m.generation(ids, max_tokens=n, sampler=GREEDY))
    stops = set(ref.tokenizer.stop_ids)
    return out[: next((i for i, t in enumerate(out) if t in stops), len(out))]


def _text(ref, ids) -> str:
    return ref.detokenize(ids)


def test_get_lora_adapters_lists_them(http, adapters):
    r = http.get("/lora-adapters")
    assert r.status_code == 200, r.text
    extra = {"task_name": "", "prompt_prefix": ""}  # llama-server's fields (no aLoRA here)
    assert r.json() == [
        {"id": 0, "path": str(adapters["wide"]), "scale": 1.0, **extra},
        {"id": 1, "path": str(adapters["narrow"]), "scale": 1.0, **extra},
    ]


CASES = [
    ([{"id": 0, "scale": 0.7}], [("wide", 0.7)]),
    ([{"id": 1, "scale": 1.5}], [("narrow", 1.5)]),
    ([{"id": 0, "scale": 0.3}, {"id": 1, "scale": -0.5}], [("wide", 0.3), ("narrow", -0.5)]),
    ([], []),
]


def test_completion_lora_field_mixed_in_one_batch(http, ref, adapters):
    """Four /completion requests at once, each its own adapters (or none): each answer is
    the library's with only those adapters; they ran as one batch (no request waited for
    another's adapters)."""

    def post(lora):
        body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "lora": lora}
        r = http.post("/completion", json=body)
        assert r.status_code == 200, r.text
        return r.json()["content"]

    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(post, [lora for lora, _ in CASES]))
    for text, (_, members) in zip(got, CASES, strict=True):
        assert text == _text(ref, _tokens(ref, members, adapters, PROMPT)), members
    assert len(set(got)) == len(got)  # the adapters change the answer


def test_openai_clients_extra_body_lora(server, ref, adapters):
    openai = oracle("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=300)
    r = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        extra_body={"lora": [{"id": 1, "scale": 1.5}]},
    )
    assert r.choices[0].text == _text(ref, _tokens(ref, [("narrow", 1.5)], adapters, PROMPT))
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    text = chat_prompt(ref, messages)
    ids = ref.tokenize(text, parse_special=True)
    for lora, members in CASES[:1] + CASES[3:]:
        c = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0, extra_body={"lora": lora}
        )
        want = _tokens(ref, members, adapters, ids)
        assert c.choices[0].message.content == _text(ref, want), members


def test_post_lora_adapters_sets_the_global_scales(http, ref, adapters):
    r = http.post("/lora-adapters", json=[{"id": 1, "scale": 1.5}])
    assert r.status_code == 200, r.text
    assert r.json() == {"success": True}
    try:
        listed = http.get("/lora-adapters").json()
        assert [a["scale"] for a in listed] == [0.0, 1.5]  # not listed: off (llama-server)
        body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0}
        got = http.post("/completion", json=body).json()["content"]
        assert got == _text(ref, _tokens(ref, [("narrow", 1.5)], adapters, PROMPT))
        # a request's own field still wins over the global scales
        body["lora"] = [{"id": 0, "scale": 0.7}]
        got = http.post("/completion", json=body).json()["content"]
        assert got == _text(ref, _tokens(ref, [("wide", 0.7)], adapters, PROMPT))
    finally:
        http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}])
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0}
    got = http.post("/completion", json=body).json()["content"]
    assert got == _text(ref, _tokens(ref, [("wide", 1.0), ("narrow", 1.0)], adapters, PROMPT))


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/completion", {"prompt": PROMPT, "lora": [{"id": 2, "scale": 1}]}, "invalid adapter id"),
        ("/completion", {"prompt": PROMPT, "lora": {"id": 0}}, "must be a list"),
        ("/completion", {"prompt": PROMPT, "lora": [{"id": 0, "scale": "x"}]}, "a number"),
        ("/completion", {"prompt": PROMPT, "lora": [{"id": 0, "scale": 1e300}]}, "finite"),
        ("/v1/completions", {"model": "tiny", "prompt": "a", "lora": [{"id": -1}]}, "invalid"),
        ("/lora-adapters", [{"id": 7, "scale": 1}], "invalid adapter id"),
        ("/lora-adapters", {"id": 0, "scale": 1}, "must be a list"),
    ],
)
def test_bad_lora_is_a_400(http, path, body, message):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert message in r.text


def test_cli_lora_flags():
    import typer

    from cli.serve_cmds import lora_list

    assert lora_list(["a.gguf", "b.gguf:0.5,d.gguf"], ["c.gguf:2,e.gguf:-1"], False) == [
        ("a.gguf", 1.0),
        ("b.gguf", 0.5),
        ("d.gguf", 1.0),
        ("c.gguf", 2.0),
        ("e.gguf", -1.0),
    ]
    assert lora_list(["a.gguf:0.5"], [], True) == [("a.gguf", 0.0)]
    with pytest.raises(typer.BadParameter, match="not PATH:SCALE"):
        lora_list([], ["c.gguf"], False)


def test_llamay_serve_lora_flags_as_a_process(tiny_paths, serve_home, adapters, ref):
    """`llamay serve --lora PATH:SCALE --lora-scaled PATH:SCALE` as a process: the adapters
    at those scales, requests without a `lora` field applying them."""
    from tests.serve.test_serve_cli import serve_process

    args = ("--lora", f"{adapters['wide']}:0.7", "--lora-scaled", f"{adapters['narrow']}:1.5")
    with serve_process(tiny_paths, serve_home, *args) as (_, url):
        listed = httpx.get(url + "/lora-adapters", timeout=120).json()
        assert [(a["path"], a["scale"]) for a in listed] == [
            (str(adapters["wide"]), 0.7),
            (str(adapters["narrow"]), 1.5),
        ]
        body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0}
        got = httpx.post(url + "/completion", json=body, timeout=300).json()["content"]
        both = [("wide", 0.7), ("narrow", 1.5)]
        assert got == _text(ref, _tokens(ref, both, adapters, PROMPT))


def test_serve_lora_needs_a_model_and_a_file(tiny_paths, tmp_path):
    from llamay.errors import AdapterError

    with pytest.raises(AdapterError, match="for the first --model"):
        Models({}, lora=[(tmp_path / "x.gguf", 1.0)])
    with pytest.raises(AdapterError, match="no such LoRA adapter file"):
        Models({"tiny": tiny_paths["tiny"]}, lora=[(tmp_path / "x.gguf", 1.0)])
