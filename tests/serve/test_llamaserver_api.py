"""llama-server's API as its clients send it (raw HTTP over loopback, as curl does),
held to llama-server itself (tests/fixtures/llamaserver/goldens.json, recorded from the
llama-server binary on the same tiny models) and to its tools/server/README.md:
/slots per slot and its save/restore/erase actions, /infill, return_tokens,
post_sampling_probs, string logit_bias keys, batched prompts, timings.cache_n, and a
table of the README's request shapes."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np
import pytest
from fixture_data import fixture

import llamay
from llamay.sample import GREEDY
from llamay.serve import create_app
from llamay.serve.models import Models
from tests.serve.conftest import greedy, running, wait_idle
from tests.serve.fim_model import FIM_META, INFILL_REQUEST, POST_PROB_REQUESTS, write_fim_model


@pytest.fixture(scope="module")
def golden():
    return json.loads(fixture("llamaserver", "goldens.json").read_text())


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture
def slot_dir(server, tmp_path):
    d = tmp_path / "slots"
    d.mkdir()
    server.state.extra["slot_save_path"] = str(d)
    yield d
    server.state.extra.pop("slot_save_path", None)


def _text(model, ids: list[int], n: int) -> tuple[str, list[int]]:
    toks = list(model.generation(ids, n, GREEDY))
    return model.detokenize(toks), toks


# --- /slots -------------------------------------------------------------------------------

README_SLOT_KEYS = {"id", "id_task", "n_ctx", "speculative", "is_processing", "params"}
README_NEXT_TOKEN = {"has_next_token", "has_new_line", "n_remain", "n_decoded"}


def test_slots_one_object_per_slot_with_llama_servers_fields(http, server, golden):
    idle = http.get("/slots").json()
    assert [s["id"] for s in idle] == list(range(server.state.models.parallel))
    assert not any(s["is_processing"] for s in idle)
    assert http.get("/slots?fail_on_no_slot=1").status_code == 200
    box: dict = {}

    def long():
        box["r"] = httpx.post(
            server.url + "/completion",
            json={"prompt": "a b c", "n_predict": 200, "ignore_eos": True, "temperature": 0},
            timeout=300,
        )

    t = threading.Thread(target=long)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while True:
            busy = [s for s in http.get("/slots").json() if s["is_processing"]]
            if busy and busy[0]["next_token"]["n_decoded"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        t.join()
    assert len(busy) == 1, busy
    s = busy[0]
    # the README's example keys, and those llama-server itself returns for a busy slot
    # (its next_token is one object in the README, a list in the binary: the README's)
    real = golden["slots_busy"][0]
    assert README_SLOT_KEYS | {"next_token"} <= set(s)
    assert set(real) - {"n_prompt_tokens_processed"} <= set(s)
    assert set(s["next_token"]) == README_NEXT_TOKEN == set(real["next_token"][0])
    shared = {k for k in real["params"] if k in s["params"]}
    assert {"temperature", "top_k", "top_p", "min_p", "n_predict", "n_probs", "samplers"} <= shared
    assert s["params"]["n_predict"] == 200 and s["params"]["ignore_eos"] is True
    assert s["params"]["temperature"] == 0.0
    assert s["next_token"]["has_next_token"] is True
    assert s["n_ctx"] == server.state.models.loaded["tiny"].model.n_ctx
    assert box["r"].json()["id_slot"] == s["id"]  # the completion names the same slot


def test_slot_actions_refused_without_slot_save_path(http, golden):
    want = golden["slots_without_save_path"]
    r = http.post("/slots/0?action=save", json={"filename": "x.bin"})
    assert (r.status_code, r.json()) == (want["status"], want["body"])


@pytest.mark.parametrize(
    "name", ["../x.bin", "a/b.bin", "..", ".", "x:y", " x", "x.", "a\\b", "", "a\x01b"]
)
def test_slot_filenames_never_leave_the_save_path(http, slot_dir, golden, name):
    http.post("/completion", json={"prompt": "The sea", "n_predict": 2, "temperature": 0})
    r = http.post("/slots/0?action=save", json={"filename": name})
    want = golden["slot_bad_filename"]
    assert (r.status_code, r.json()) == (want["status"], want["body"])
    assert list(slot_dir.parent.rglob("*.bin")) == [] and list(slot_dir.iterdir()) == []


def test_slot_save_restore_erase(http, server, slot_dir, golden, tiny_paths, tiny):
    prompt = "The quick brown fox jumps over the lazy dog. " * 3
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 4, "temperature": 0})
    first = r.json()
    slot = first["id_slot"]
    wait_idle(server.state)
    saved = http.post(f"/slots/{slot}?action=save", json={"filename": "fox.bin"})
    assert saved.status_code == 200, saved.text
    body = saved.json()
    assert set(body) == set(golden["slot_save"]) and set(body["timings"]) == {"save_ms"}
    n = first["tokens_evaluated"] + first["tokens_predicted"]
    assert body["n_saved"] == n and body["filename"] == "fox.bin"
    assert body["n_written"] == (slot_dir / "fox.bin").stat().st_size > 0
    assert http.post("/slots/99?action=save", json={"filename": "y"}).status_code == 400
    assert http.post(f"/slots/{slot}?action=nope").json()["error"]["message"] == "Invalid action"

    # a fresh server over the same model: restoring puts the K/V in its prefix cache
    models = Models({"tiny": tiny_paths["tiny"]}, use_store=False, default_keep_alive=-1)
    app = create_app(models, max_tokens_limit=64)
    app.state.llamay.extra["slot_save_path"] = str(slot_dir)
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    _, toks = _text(tiny, ids, 4)
    again = ids + toks + tiny.tokenize(" Again", add_special=False, parse_special=False)
    more = {"prompt": again, "n_predict": 3, "temperature": 0}
    with running(app) as fresh, httpx.Client(base_url=fresh.url, timeout=300) as c:
        cold = c.post("/completion", json={**more, "prompt": "Unrelated words here."}).json()
        assert cold["timings"]["cache_n"] == 0
        r = c.post("/slots/1?action=restore", json={"filename": "fox.bin"})
        assert r.status_code == 200, r.text
        rb = r.json()
        assert set(rb) == set(golden["slot_restore"]) and set(rb["timings"]) == {"restore_ms"}
        assert rb["n_restored"] == n and rb["n_read"] == body["n_written"]
        warm = c.post("/completion", json=more).json()
        assert warm["timings"]["cache_n"] == n  # the slot's sequence: every token's K/V
        assert warm["timings"]["prompt_n"] == len(again) - n
        # llama-server's tokens_cached: what the slot holds after (the last token uncomputed)
        assert warm["tokens_cached"] == len(again) + 3 - 1
        assert warm["content"] == _text(tiny, again, 3)[0]  # the same K/V as computing them
        # a prompt that shares only the start: that much of the slot's K/V is reused
        other = ids + tiny.tokenize(" Something else entirely.", add_special=False)
        saved_tokens = ids + toks
        lcp = next(j for j, (a, b) in enumerate(zip(other, saved_tokens, strict=False)) if a != b)
        part = c.post("/completion", json={**more, "prompt": other}).json()
        assert part["timings"]["cache_n"] == lcp >= len(ids)
        assert part["content"] == _text(tiny, other, 3)[0]
        held = [s for s in c.get("/slots").json() if s["id"] == 1][0]["n_cached"]
        erased = c.post("/slots/1?action=erase").json()
        assert set(erased) == set(golden["slot_erase"]) and erased["n_erased"] == held > 0
        assert [s for s in c.get("/slots").json() if s["id"] == 1][0]["n_cached"] == 0
        missing_file = c.post("/slots/0?action=restore", json={"filename": "none.bin"})
        assert missing_file.status_code == 400


# --- /infill ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fim(tiny_paths, tmp_path_factory):
    path = write_fim_model(tiny_paths["tiny"], tmp_path_factory.mktemp("fim") / "fim.gguf")
    app = create_app(
        Models({"fim": path}, use_store=False, default_keep_alive=-1), max_tokens_limit=64
    )
    with running(app) as s:
        yield s, path


def test_infill_lays_out_the_prompt_as_llama_server(fim, golden):
    s, path = fim
    want = golden["infill_4096"]  # llama-server's slot was capped at the model's 2048
    r = httpx.post(s.url + "/infill", json={**INFILL_REQUEST, "return_tokens": True}, timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt"] == want["prompt"]
    assert body["tokens_evaluated"] == want["tokens_evaluated"]
    model = llamay.load(path)

    def tok(text):
        return model.tokenize(text, add_special=False, parse_special=False)

    # the README's layout, each part tokenised alone (the extra context: the 2 tokens a
    # 2048 context leaves room for, the end of "<FIM_SEP>filename\n")
    fim = {k.split(".")[-1]: v for k, v in FIM_META.items()}
    ids = [
        *tok("filename\n"),
        fim["fim_pre_token_id"],
        *tok(INFILL_REQUEST["input_prefix"]),
        *tok(INFILL_REQUEST["prompt"]),
        fim["fim_suf_token_id"],
        *tok(INFILL_REQUEST["input_suffix"]),
        fim["fim_mid_token_id"],
    ]
    assert len(ids) == want["tokens_evaluated"] and model.detokenize(ids) == want["prompt"]
    text, toks = _text(model, ids, INFILL_REQUEST["n_predict"])
    assert body["tokens"] == toks and body["content"] == text


def test_infill_prompt_in_a_small_context(fim, golden):
    from types import SimpleNamespace

    from llamay.serve.infill import infill_prompt

    _, path = fim
    small = llamay.load(path, n_ctx=512)
    lm = SimpleNamespace(model=small, name="fim")
    req = INFILL_REQUEST
    ids = infill_prompt(lm, req["input_prefix"], req["input_suffix"], req["input_extra"], "return")
    assert small.detokenize(ids) == golden["infill"]["prompt"]  # no room for the extra
    assert len(ids) == golden["infill"]["tokens_evaluated"]


def test_infill_refusals(http, fim, golden):
    want = golden["infill_no_fim"]
    r = http.post("/infill", json=INFILL_REQUEST)  # the tiny llama names no FIM tokens
    assert (r.status_code, r.json()) == (want["status"], want["body"])
    s, _ = fim
    r = httpx.post(s.url + "/infill", json={"input_suffix": "x"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == '"input_prefix" is required'
    r = httpx.post(
        s.url + "/infill",
        json={"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]},
        timeout=60,
    )
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]


# --- /completion fields --------------------------------------------------------------------


def _chain(logits: np.ndarray, top_k=40, top_p=0.95, min_p=0.05, temperature=0.8):
    """llama.cpp's default sampler chain over the whole vocabulary, as its README and
    samplers define it: top_k, top_p (softmax over what is left), min_p (logit >= best +
    log p), temperature, then dist's softmax. [(id, prob)] best first."""
    order = np.argsort(-logits, kind="stable")
    lg = logits[order]
    n = len(lg)
    if temperature <= 0:
        return [(int(order[0]), 1.0)]
    if top_k > 0:
        n = min(n, top_k)
    if top_p < 1.0:
        p = np.exp(lg[:n] - lg[0])
        cum = np.cumsum(p / p.sum())
        n = int(np.nonzero(cum >= top_p)[0][0]) + 1
    if min_p > 0:
        n = int(np.sum(lg[:n] >= lg[0] + np.log(min_p)))
    p = np.exp((lg[:n] - lg[0]) / temperature)
    p /= p.sum()
    return [(int(i), float(q)) for i, q in zip(order[:n], p, strict=True)]


@pytest.mark.parametrize("case", range(len(POST_PROB_REQUESTS)))
def test_post_sampling_probs_after_the_sampler_chain(fim, golden, case):
    s, path = fim
    req = golden["post_sampling_probs"][case]["request"]
    r = httpx.post(s.url + "/completion", json=req, timeout=300)
    assert r.status_code == 200, r.text
    first = r.json()["completion_probabilities"][0]
    # llama-server's shape: prob and top_probs in place of logprob and top_logprobs
    assert set(first) == {"id", "token", "bytes", "prob", "top_probs"}
    assert all(set(t) == {"id", "token", "bytes", "prob"} for t in first["top_probs"])
    got = [(t["id"], t["prob"]) for t in first["top_probs"]]
    model = llamay.load(path)
    ids = model.tokenize(req["prompt"], add_special=True, parse_special=True)
    logits = np.asarray(model.logits(ids)[-1], np.float64)
    knobs = {k: req[k] for k in ("top_k", "top_p", "min_p", "temperature") if k in req}
    want = _chain(logits, **knobs)[: req["n_probs"]]
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([p for _, p in got], [p for _, p in want], atol=1e-4)
    assert first["prob"] == pytest.approx(
        dict(_chain(logits, **knobs)).get(first["id"], 0.0), abs=1e-4
    )
    # llama-server on the same file: as many candidates (its chain cuts the same way)
    # and, greedy, the same one token at probability 1
    theirs = golden["post_sampling_probs"][case]["top_probs"]
    assert len(got) == len(theirs)
    if req.get("temperature") == 0:
        assert got == [tuple(x) for x in theirs]


def test_post_sampling_probs_refused_where_the_chain_cannot_be_replayed(http):
    r = http.post(
        "/completion",
        json={"prompt": "a", "n_predict": 1, "n_probs": 2, "post_sampling_probs": True,
              "repeat_penalty": 1.3},
    )  # fmt: skip
    assert r.status_code == 400 and "penalties" in r.json()["error"]["message"]


def test_return_tokens_and_timings_cache_n(http, tiny):
    prompt = "Once upon a time there was a lighthouse keeper who counted waves. " * 2
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    text, toks = _text(tiny, ids, 5)
    req = {"prompt": prompt, "n_predict": 5, "temperature": 0}
    plain = http.post("/completion", json=req).json()
    assert plain["tokens"] == [] and plain["content"] == text
    again = http.post("/completion", json={**req, "return_tokens": True}).json()
    assert again["tokens"] == toks and again["content"] == text
    t = again["timings"]
    assert t["cache_n"] > 0 and t["cache_n"] + t["prompt_n"] == len(ids)
    assert again["tokens_cached"] == len(ids) + 5 - 1 and t["predicted_n"] == 5
    with http.stream("POST", "/completion", json={**req, "stream": True}) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
    assert [tok for e in events for tok in e["tokens"]] == toks  # streamed: always there


def test_logit_bias_string_keys(http, tiny):
    prompt = "The sea"
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    _, toks = _text(tiny, ids, 4)
    word = tiny.detokenize(toks[:1])
    banned = tiny.tokenize(word, add_special=False, parse_special=False)
    base = {"prompt": prompt, "n_predict": 4, "temperature": 0, "return_tokens": True}
    for bias in ([[word, False]], {word: False}, [[word, -1e9]]):
        out = http.post("/completion", json={**base, "logit_bias": bias}).json()
        assert out["tokens"] and not set(out["tokens"]) & set(banned), (bias, out)
    hello = tiny.tokenize("Hello", add_special=False, parse_special=False)
    for bias in ([["Hello", 1e4]], {"Hello": 1e4}):
        out = http.post("/completion", json={**base, "logit_bias": bias}).json()
        assert set(out["tokens"]) <= set(hello), (bias, out)
    out = http.post("/completion", json={**base, "logit_bias": {str(hello[0]): 1e4}}).json()
    assert out["tokens"] == [hello[0]] * 4  # an all-digit key is a token id
    # an entry that is not [token, bias] is skipped, as llama-server skips it
    skipped = http.post("/completion", json={**base, "logit_bias": [["x", "y"]]}).json()
    assert skipped["tokens"] == toks


def test_batched_prompts(http, tiny):
    ids = tiny.tokenize("A cat", add_special=True, parse_special=True)
    prompts = ["The sea", ids, {"prompt_string": "Hello there"}]
    r = http.post("/completion", json={"prompt": prompts, "n_predict": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and [o["index"] for o in out] == [0, 1, 2]
    assert out[0]["content"] == greedy(tiny, "The sea", 3)
    assert out[1]["content"] == _text(tiny, ids, 3)[0]
    assert out[2]["content"] == greedy(tiny, "Hello there", 3)
    one = http.post("/completion", json={"prompt": ["The sea"], "n_predict": 3, "temperature": 0})
    assert one.json()["content"] == out[0]["content"]  # one prompt: one object, as llama-server
    mixed = http.post("/completion", json={"prompt": [*ids, " sat"], "n_predict": 2}).json()
    assert isinstance(mixed, dict)  # a top-level id: one prompt of ids and text
    body = {"prompt": ["The sea", "Hello there"], "n_predict": 3, "temperature": 0, "stream": True}
    with http.stream("POST", "/completion", json=body) as r:
        events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: ")]
    for i, p in enumerate(["The sea", "Hello there"]):
        mine = [e for e in events if e["index"] == i]
        assert "".join(e["content"] for e in mine) == greedy(tiny, p, 3)
        assert mine[-1]["stop"] is True and sum(e["stop"] for e in mine) == 1


# --- the README's request shapes -------------------------------------------------------------

MSGS = [{"role": "user", "content": "hi"}]
README_REQUESTS = [
    ("GET", "/health", None, {"status"}),
    ("GET", "/props", None, {"default_generation_settings", "total_slots", "chat_template"}),
    ("GET", "/slots", None, None),
    ("GET", "/metrics", None, None),
    ("POST", "/completion", {"prompt": "Building a website can be done in 10 simple steps:",
                             "n_predict": 8}, {"content", "stop", "timings", "tokens"}),
    ("POST", "/completion", {"prompt": [12, 34, 56], "n_predict": 2}, {"content"}),
    ("POST", "/completion", {"prompt": [12, 34, "string", 56, 78], "n_predict": 2}, {"content"}),
    ("POST", "/completion", {"prompt": {"prompt_string": "string"}, "n_predict": 2}, {"content"}),
    ("POST", "/completion", {"prompt": ["string1", [12, 34, 56], {"prompt_string": "string"}],
                             "n_predict": 2}, None),
    ("POST", "/completion", {"prompt": [[12, 34, "string", 56, 78], [12, 34, 56], "string",
                                        {"prompt_string": "string"}], "n_predict": 2}, None),
    ("POST", "/completion", {"prompt": "a", "n_predict": 2, "logit_bias": [[15043, 1.0]]}, None),
    ("POST", "/completion", {"prompt": "a", "n_predict": 2, "logit_bias": [[15043, False]]}, None),
    ("POST", "/completion", {"prompt": "a", "n_predict": 2,
                             "logit_bias": [["Hello, World!", -0.5]]}, None),
    ("POST", "/completion", {"prompt": "a", "n_predict": 2, "n_probs": 3,
                             "post_sampling_probs": True}, {"completion_probabilities"}),
    ("POST", "/completion", {"prompt": "a", "n_predict": 2, "return_tokens": True,
                             "samplers": ["top_k", "typ_p", "top_p", "min_p", "temperature"],
                             "cache_prompt": True, "seed": 42, "id_slot": -1}, {"tokens"}),
    ("POST", "/completion", {"prompt": "a", "n_predict": 0}, {"content"}),
    ("POST", "/completions", {"prompt": "a", "n_predict": 2}, {"content"}),
    ("POST", "/tokenize", {"content": "Hello world!"}, {"tokens"}),
    ("POST", "/tokenize", {"content": "Hello world!", "with_pieces": True}, {"tokens"}),
    ("POST", "/tokenize", {"content": "á", "add_special": True, "parse_special": False},
     {"tokens"}),
    ("POST", "/detokenize", {"tokens": [123, 456]}, {"content"}),
    ("POST", "/apply-template", {"messages": MSGS}, {"prompt"}),
    ("POST", "/embedding", {"model": "bert", "content": "Hello"}, None),
    ("POST", "/embeddings", {"model": "bert", "content": ["Hello", "world"]}, None),
    ("POST", "/v1/embeddings", {"model": "bert", "input": "hello"}, {"data"}),
    *[
        ("POST", path, {"model": "bert", "query": "What is panda?", "top_n": 3,
                        "documents": ["hi", "it is a bear", "The giant panda is a bear."]},
         {"results"})
        for path in ("/reranking", "/rerank", "/v1/rerank", "/v1/reranking")
    ],
    ("GET", "/v1/models", None, {"data"}),
    ("GET", "/models", None, {"data"}),
    ("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 2}, {"choices"}),
    ("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2}, {"choices"}),
    ("POST", "/chat/completions", {"messages": MSGS,
                                   "max_tokens": 2}, {"choices"}),
    ("POST", "/responses", {"input": "hi", "max_output_tokens": 2}, {"output"}),
    ("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 2}, {"output"}),
    ("POST", "/v1/chat/completions", {"messages": MSGS, "max_tokens": 2, "n_probs": 2,
                                      "grammar": 'root ::= "yes" | "no"'}, {"choices"}),
    ("POST", "/slots/0?action=erase", None, None),  # without --slot-save-path: 501
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "body", "keys"), README_REQUESTS)
def test_readme_request_shapes_are_accepted(http, method, path, body, keys):
    r = http.request(method, path, json=body, headers={"Content-Type": "application/json"})
    if path.startswith("/slots/"):
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
        return
    assert r.status_code == 200, (path, body, r.text)
    if keys is not None:
        assert keys <= set(r.json()), r.json()
    if isinstance(body, dict) and isinstance(body.get("prompt"), list) and path == "/completion":
        out = r.json()
        several = not any(isinstance(x, int) for x in body["prompt"])
        assert isinstance(out, list) == (several and len(body["prompt"]) > 1)


def test_timings_on_the_openai_compatible_answers(server, tiny):
    """llama-server adds `timings` to its /v1/chat/completions and /v1/completions
    answers (and to each choice's last streamed chunk); the official client keeps them."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "hi"}]
    greedy = {"max_tokens": 3, "temperature": 0}  # (a sampled stop token would end it early)
    chat = client.chat.completions.create(model="tiny", messages=msgs, **greedy)
    t = chat.model_extra["timings"]
    assert t["predicted_n"] == chat.usage.completion_tokens
    assert t["prompt_n"] + t["cache_n"] == chat.usage.prompt_tokens
    assert t["cache_n"] == chat.usage.prompt_tokens_details.cached_tokens
    cmpl = client.completions.create(model="tiny", prompt="The sea", **greedy)
    t = cmpl.model_extra["timings"]
    assert t["predicted_n"] == cmpl.usage.completion_tokens == 3
    assert t["prompt_n"] + t["cache_n"] == cmpl.usage.prompt_tokens
    for stream in (
        client.chat.completions.create(model="tiny", messages=msgs, **greedy, stream=True),
        client.completions.create(model="tiny", prompt="The sea", **greedy, stream=True),
    ):
        chunks = list(stream)
        ends = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(ends) == 1 and ends[0].model_extra["timings"]["predicted_n"] == 3
        assert all("timings" not in (c.model_extra or {}) for c in chunks if c not in ends)


@pytest.mark.slow
def test_serve_slot_save_path_flag(tiny_paths, serve_home, tmp_path):
    """`llamay serve --slot-save-path DIR` (llama-server's flag): slot files land in DIR."""
    from tests.serve.test_serve_cli import serve_process

    with serve_process(tiny_paths, serve_home, "--slot-save-path", str(tmp_path)) as (_, url):
        with httpx.Client(base_url=url, timeout=300) as c:
            done = c.post("/completion", json={"prompt": "The sea", "n_predict": 2}).json()
            slot = done["id_slot"]
            r = c.post(f"/slots/{slot}?action=save", json={"filename": "cli.bin"})
            assert r.status_code == 200, r.text
            assert r.json()["n_written"] == (tmp_path / "cli.bin").stat().st_size


def test_n_predict_0_evaluates_the_prompt_into_the_cache(http, server, slot_dir, tiny):
    """README: "When 0, no tokens will be generated but the prompt is evaluated into the
    cache" - the next request sharing the prompt starts past it, and the slot holds it."""
    prompt = "A lighthouse stood on the rocks and its keeper counted every wave. " * 2
    ids = tiny.tokenize(prompt, add_special=True, parse_special=True)
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["content"] == "" and body["tokens_predicted"] == 0
    assert body["tokens_evaluated"] == len(ids) and body["stop"] is True
    more = ids + tiny.tokenize(" The end.", add_special=False, parse_special=False)
    nxt = http.post("/completion", json={"prompt": more, "n_predict": 2, "temperature": 0})
    assert nxt.json()["timings"]["cache_n"] >= (len(ids) - 1) // 16 * 16 > 0
    assert nxt.json()["content"] == _text(tiny, more, 2)[0]
    http.post("/completion", json={"prompt": prompt, "n_predict": 0})
    wait_idle(server.state)
    saved = http.post(f"/slots/{body['id_slot']}?action=save", json={"filename": "p.bin"})
    assert saved.status_code == 200 and saved.json()["n_saved"] == len(ids)


def test_id_slot_names_the_slot_a_request_fills(http, server, slot_dir, tiny):
    """README: `id_slot` assigns the completion to a slot; saving that slot then saves
    this request's sequence, whichever engine slot ran it."""
    last = server.state.models.parallel - 1
    req = {"prompt": "The sea", "n_predict": 3, "temperature": 0, "id_slot": last}
    out = http.post("/completion", json=req).json()
    assert out["id_slot"] == last
    wait_idle(server.state)
    saved = http.post(f"/slots/{last}?action=save", json={"filename": "pin.bin"}).json()
    assert saved["n_saved"] == out["tokens_evaluated"] + out["tokens_predicted"]
    # a slot past the last is no slot (test_llamaserver_requests holds it to llama-server)
    r = http.post("/completion", json={**req, "id_slot": last + 1})
    assert r.status_code == 200 and 0 <= r.json()["id_slot"] <= last


def test_n_cmpl_completions_per_prompt(http, server, tiny):
    """README: n_cmpl completions of each prompt, "N prompts times n_cmpl entries"."""
    body = {"prompt": ["The sea", "A cat"], "n_predict": 3, "temperature": 0, "n_cmpl": 2}
    out = http.post("/completion", json=body).json()
    assert [o["index"] for o in out] == [0, 1, 2, 3]
    want = [greedy(tiny, p, 3) for p in ("The sea", "The sea", "A cat", "A cat")]
    assert [o["content"] for o in out] == want
    n = server.state.models.parallel
    for bad in (0, n + 1):
        r = http.post("/completion", json={**body, "n_cmpl": bad})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("n_cmpl")


@pytest.mark.parametrize("seed", range(40))
def test_post_sampling_replay_equals_the_whole_vocabulary_or_refuses(seed):
    """The replay from the best 64 tokens (what the engine hands over) equals llama.cpp's
    chain over the whole vocabulary whenever it answers; the default settings answer."""
    from llamay.sample import Sampler
    from llamay.serve.errors import ApiError
    from llamay.serve.post_probs import WIDTH, post_sampling

    rng = np.random.default_rng(seed)
    raw = rng.normal(0, 1 + 2 * rng.random(), 1000)
    logp = raw - np.logaddexp.reduce(raw)
    top = np.argsort(-logp, kind="stable")[:WIDTH]
    alts = [(int(i), float(logp[i])) for i in top]
    knobs = {
        "top_k": int(rng.choice([0, 1, 5, 40, 64, 100])),
        "top_p": float(rng.choice([1.0, 0.95, 0.5, 0.1])),
        "min_p": float(rng.choice([0.0, 0.05, 0.2])),
        "temperature": float(rng.choice([0.0, 0.3, 0.8, 1.5])),
    }
    bias = {}
    if seed % 3 == 1:  # ban some of the best, boost one listed
        bias = {int(top[0]): -np.inf, int(top[3]): -np.inf, int(top[10]): 2.0}
    elif seed % 3 == 2:
        bias = {int(np.argsort(-logp)[500]): 5.0}  # boosts one far outside the list
    sampler = Sampler(**knobs, logit_bias=tuple(bias.items()))
    biased = logp + np.asarray([bias.get(i, 0.0) for i in range(1000)])
    want = _chain(np.where(np.isfinite(biased), biased, -1e300), **knobs)
    want = [(i, p) for i, p in want if np.isfinite(biased[i]) and p > 0]
    try:
        prob, got = post_sampling(sampler, want[0][0], alts, 10)
    except ApiError:
        assert knobs["top_k"] == 0 or knobs["top_k"] > 64 or bias, knobs  # refused: only so
        return
    assert [i for i, _ in got] == [i for i, _ in want[:10]], (knobs, bias)
    np.testing.assert_allclose([p for _, p in got], [p for _, p in want[:10]], atol=1e-9)
    assert prob == pytest.approx(want[0][1])
