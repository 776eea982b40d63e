"""Issue 19's missing features, as the peers' clients send them over real loopback:
Ollama's `logprobs`/`top_logprobs` (generate and chat, streamed and not) and `suffix`;
OpenAI's `best_of`, `suffix` and `usage.prompt_tokens_details.cached_tokens`.

Oracles: log-probabilities are a float64 log-softmax of the model's own logits; fill in the
middle is llama.cpp's /infill layout (`[BOS] <fim_pre> prefix <fim_suf> suffix <fim_mid>`,
tools/server's format_infill) decoded greedily by the model directly; best_of is OpenAI's
rule (of best_of candidates, the one with the highest mean log-probability per token),
with each candidate regenerated alone. Responses validate as the clients' typed models,
strictly (`model_validate_json(..., strict=True)`).
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import ollama
import openai
import pytest
from ollama._types import ChatResponse, GenerateResponse
from openai.types import Completion
from openai.types.chat import ChatCompletion

from llamay.sample import GREEDY
from tests.serve.conftest import chat_prompt, running

FIM = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10}  # <issue_start> ... as FIM tokens


@pytest.fixture(scope="module")
def fim_path(tiny_paths, tmp_path_factory):
    """The tiny llama with FIM tokens named in its GGUF (tokenizer.ggml.fim_*_token_id)."""
    from llamay.gguf.values import GGUFValueType
    from llamay.gguf.writer import copy_gguf

    dst = tmp_path_factory.mktemp("fim") / "tiny-fim.gguf"
    meta = {f"tokenizer.ggml.{k}_token_id": v for k, v in FIM.items()}
    types = dict.fromkeys(meta, GGUFValueType.UINT32)
    return copy_gguf(tiny_paths["tiny"], dst, metadata=meta, types=types)


#: A ChatML template that renders `tools` itself (SmolLM2's has no place for them).
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "Tools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tools_path(tiny_paths, tmp_path_factory):
    """The tiny llama with a chat template that renders tools."""
    from llamay.gguf.writer import copy_gguf

    dst = tmp_path_factory.mktemp("tools") / "tiny-tools.gguf"
    return copy_gguf(tiny_paths["tiny"], dst, metadata={"tokenizer.chat_template": TOOLS_TEMPLATE})


@pytest.fixture(scope="module")
def srv(tiny_paths, fim_path, tools_path, serve_home):
    from llamay.serve import create_app
    from llamay.serve.models import Models

    paths = {"tiny": tiny_paths["tiny"], "fim": fim_path, "tools": tools_path}
    models = Models(paths, use_store=False, default_keep_alive=-1)
    with running(create_app(models, max_tokens_limit=256)) as s:
        yield s


@pytest.fixture(scope="module")
def http(srv):
    with httpx.Client(base_url=srv.url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def fim_model(fim_path):
    import llamay

    return llamay.load(fim_path)


def _want(tiny, prompt_ids, n):
    """Greedy tokens after prompt_ids and float64 log-softmax rows at each."""
    toks = list(tiny.generation(prompt_ids, n, GREEDY))
    rows = np.asarray(tiny.logits(prompt_ids + toks)[len(prompt_ids) - 1 : -1], np.float64)
    rows = rows - rows.max(-1, keepdims=True)
    return toks, rows - np.log(np.exp(rows).sum(-1, keepdims=True))


def _piece(model, i) -> str:
    return model.tokenizer.token_to_piece(i).decode("utf-8", "replace")


def _check_ollama_logprobs(tiny, lps, prompt_ids, n, top):
    toks, want = _want(tiny, prompt_ids, n)
    assert [lp["token"] for lp in lps] == [_piece(tiny, t) for t in toks]
    for lp, t, row in zip(lps, toks, want, strict=True):
        assert lp["logprob"] == pytest.approx(row[t], abs=1e-4)
        if "bytes" in lp:  # the raw answer has them (the client's typed model drops them)
            assert lp["bytes"] == list(tiny.tokenizer.token_to_piece(t))
        best = np.argsort(-row, kind="stable")[:top]
        if top:
            assert [a["token"] for a in lp["top_logprobs"]] == [_piece(tiny, i) for i in best]
            np.testing.assert_allclose(
                [a["logprob"] for a in lp["top_logprobs"]], row[best], atol=1e-4
            )
        else:
            assert not lp.get("top_logprobs")


@pytest.mark.parametrize("top", [0, 3])
def test_ollama_generate_logprobs(http, srv, tiny, top):
    body = {
        "model": "tiny",
        "prompt": "Why is the sky blue?",
        "stream": False,
        "logprobs": True,
        "top_logprobs": top,
        "options": {"temperature": 0, "num_predict": 5},
    }
    r = http.post("/api/generate", content=json.dumps(body))  # curl -d: no Content-Type
    assert r.status_code == 200, r.text
    typed = GenerateResponse.model_validate_json(r.text, strict=True)
    ids = tiny.tokenize(
        chat_prompt(tiny, [{"role": "user", "content": body["prompt"]}]), parse_special=True
    )
    lps = r.json()["logprobs"]
    assert all("bytes" in lp for lp in lps)
    assert len(typed.logprobs) == 5 and "".join(x["token"] for x in lps) == typed.response
    _check_ollama_logprobs(tiny, lps, ids, 5, top)
    # streamed through the official client: each chunk carries its own tokens' rows
    client = ollama.Client(host=srv.url)
    parts = list(
        client.generate(
            model="tiny",
            prompt=body["prompt"],
            stream=True,
            logprobs=True,
            top_logprobs=top,
            options=body["options"],
        )
    )
    rows = [lp.model_dump(exclude_none=True) for p in parts for lp in p.logprobs or []]
    assert sum(1 for p in parts if p.logprobs) > 1
    _check_ollama_logprobs(tiny, rows, ids, 5, top)
    # without logprobs: none
    assert "logprobs" not in http.post("/api/generate", json={**body, "logprobs": False}).json()


def test_ollama_chat_logprobs_and_range(http, srv, tiny):
    msgs = [{"role": "user", "content": "Hi there"}]
    client = ollama.Client(host=srv.url)
    r = client.chat(
        model="tiny",
        messages=msgs,
        logprobs=True,
        top_logprobs=2,
        options={"temperature": 0, "num_predict": 4},
    )
    ChatResponse.model_validate_json(r.model_dump_json(exclude_none=True), strict=True)
    ids = tiny.tokenize(chat_prompt(tiny, msgs), parse_special=True)
    rows = [lp.model_dump(exclude_none=True) for lp in r.logprobs]
    _check_ollama_logprobs(tiny, rows, ids, 4, 2)
    assert "".join(x["token"] for x in rows) == r.message.content
    parts = list(
        client.chat(
            model="tiny",
            messages=msgs,
            stream=True,
            logprobs=True,
            top_logprobs=2,
            options={"temperature": 0, "num_predict": 4},
        )
    )
    assert [lp.model_dump(exclude_none=True) for p in parts for lp in p.logprobs or []] == rows
    bad = {"model": "tiny", "messages": msgs, "logprobs": True, "top_logprobs": 21}
    r = http.post("/api/chat", json=bad)
    assert r.status_code == 400 and "top_logprobs" in r.json()["error"]


def _fim_oracle(model, prefix, suffix, n):
    ids = [
        FIM["fim_pre"],
        *model.tokenize(prefix, add_special=False),
        FIM["fim_suf"],
        *model.tokenize(suffix, add_special=False),
        FIM["fim_mid"],
    ]
    assert not model.tokenizer.vocab.add_bos  # SmolLM2's tokenizer: no BOS
    toks = list(model.generation(ids, n, GREEDY))
    return ids, model.detokenize(toks)


PREFIX, SUFFIX = "def add(a, b):\n    ", "\n    return c\n"


def test_ollama_suffix_fills_in_the_middle(http, srv, fim_model):
    ids, want = _fim_oracle(fim_model, PREFIX, SUFFIX, 6)
    client = ollama.Client(host=srv.url)
    r = client.generate(
        model="fim",
        prompt=PREFIX,
        suffix=SUFFIX,
        options={"temperature": 0, "num_predict": 6},
        stream=False,
    )
    assert r.response == want
    assert r.prompt_eval_count == len(ids) and list(r.context[: len(ids)]) == ids
    streamed = client.generate(
        model="fim", prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 6}
    )
    assert streamed.response == want
    # a model without FIM tokens: a clear 400, never a prompt that drops the suffix
    with pytest.raises(ollama.ResponseError) as e:
        client.generate(model="tiny", prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 2})
    assert e.value.status_code == 400 and "does not support insert" in e.value.error
    # /api/show says which can: Ollama's "insert" capability
    assert "insert" in client.show("fim").capabilities
    assert "insert" not in client.show("tiny").capabilities


def test_openai_suffix_fills_in_the_middle(http, srv, fim_model):
    ids, want = _fim_oracle(fim_model, PREFIX, SUFFIX, 6)
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    r = client.completions.create(
        model="fim", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0
    )
    Completion.model_validate_json(r.model_dump_json(), strict=True)
    assert r.choices[0].text == want and r.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX, max_tokens=2)


def test_openai_best_of_returns_the_best_candidate(http, srv):
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=1.0)
    # each candidate alone: best_of's candidate i samples with seed + i
    alone = []
    for i in range(3):
        c = client.completions.create(seed=40 + i, logprobs=0, **kw)
        lps = c.choices[0].logprobs.token_logprobs
        alone.append((float(np.mean(lps)), c.choices[0].text, c.usage.completion_tokens))
    assert len({t for _, t, _ in alone}) > 1  # the candidates differ
    best = max(alone, key=lambda a: a[0])
    raw = http.post("/v1/completions", json={**kw, "seed": 40, "best_of": 3, "n": 1, "logprobs": 0})
    assert raw.status_code == 200, raw.text
    r = Completion.model_validate_json(raw.text, strict=True)
    assert len(r.choices) == 1 and r.choices[0].text == best[1]
    assert np.mean(r.choices[0].logprobs.token_logprobs) == pytest.approx(best[0], abs=1e-5)
    assert r.usage.completion_tokens == sum(a[2] for a in alone)  # all three billed
    # n=2 of best_of=3: the two best, best first; no logprobs asked, none returned
    r = client.completions.create(seed=40, best_of=3, n=2, **kw)
    ranked = sorted(alone, key=lambda a: -a[0])
    assert [c.text for c in r.choices] == [ranked[0][1], ranked[1][1]]
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(best_of=1, n=2, **kw)
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.completions.create(best_of=2, stream=True, **kw)


def test_cached_tokens_from_the_prefix_cache(srv, tiny):
    """usage.prompt_tokens_details.cached_tokens: what the prefix cache reused: little of
    a new prompt, most of a repeated one (chat and completions)."""
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "A prompt no other test sends, to count the cache. " * 4}]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    for r in (first, second):
        ChatCompletion.model_validate_json(r.model_dump_json(), strict=True)
    n = first.usage.prompt_tokens
    # the first shares only the template's system preamble with earlier requests
    c1, c2 = (r.usage.prompt_tokens_details.cached_tokens for r in (first, second))
    assert c1 < n // 2 and n // 2 < c2 < n and c2 > c1
    prompt = "Another prompt of its own, long enough to fill a page or two. " * 4
    a = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    b = client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < b.usage.prompt_tokens_details.cached_tokens < b.usage.prompt_tokens


def test_stored_responses_continue_retrieve_and_delete(srv, tiny):
    """The Responses API's `store` (on by default), `previous_response_id` (the earlier
    turns without their instructions), `responses.retrieve` and `responses.delete`; the
    store is bounded in number and idle time."""
    from openai.types.responses import Response

    from llamay.serve.stored_responses import response_store

    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    kw = dict(model="tiny", max_output_tokens=6, temperature=0)
    q1, q2 = "Name three colours.", "And three more?"
    r1 = client.responses.create(input=q1, instructions="Be brief.", **kw)
    raw = httpx.get(f"{srv.url}/v1/responses/{r1.id}")
    got = Response.model_validate_json(raw.text, strict=True)
    assert got.id == r1.id and got.output_text == r1.output_text and got.store is True
    assert client.responses.retrieve(r1.id).output_text == r1.output_text
    # continuing: the earlier turn and its answer, not its instructions
    r2 = client.responses.create(input=q2, previous_response_id=r1.id, **kw)
    turns = [
        {"role": "user", "content": q1},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": q2},
    ]
    assert r2.output_text == tiny.generate(chat_prompt(tiny, turns), max_tokens=6, temperature=0)
    assert r2.previous_response_id == r1.id
    assert r2.usage.input_tokens == len(tiny.tokenize(chat_prompt(tiny, turns), parse_special=True))
    # a chain of three, streamed, with this turn's own instructions
    events = list(
        client.responses.create(
            input="Last one.", previous_response_id=r2.id, instructions="Answer.", stream=True, **kw
        )
    )
    r3 = events[-1].response
    chain = [
        {"role": "system", "content": "Answer."},
        *turns,
        {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "Last one."},
    ]
    assert r3.output_text == tiny.generate(chat_prompt(tiny, chain), max_tokens=6, temperature=0)
    assert client.responses.retrieve(r3.id).output_text == r3.output_text
    # store: false keeps nothing
    r4 = client.responses.create(input=q1, store=False, **kw)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r4.id)
    # delete; then neither retrieve nor previous_response_id finds it
    assert client.responses.delete(r1.id) is None
    assert httpx.delete(f"{srv.url}/v1/responses/{r1.id}").status_code == 404
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id|not found"):
        client.responses.create(input=q2, previous_response_id=r1.id, **kw)
    # bounded: the least recently used go beyond the cap, and all after the TTL unused
    store = response_store(srv.state)
    cap, ttl = store.max_items, store.ttl_s
    try:
        store.max_items = 2
        ids = [client.responses.create(input=f"n{i}", **kw).id for i in range(3)]
        assert len(store) == 2
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[0])
        assert client.responses.retrieve(ids[2]).id == ids[2]
        store.ttl_s = 0.0
        import time

        time.sleep(0.01)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ids[2])
        assert len(store) == 0
    finally:
        store.max_items, store.ttl_s = cap, ttl


WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def test_anthropic_count_tokens_counts_tools_system_and_thinking(srv, tools_path, tiny):
    """count_tokens counts the prompt the template renders: the system prompt and the
    tools (here a template that renders them; the oracle renders it directly), the same
    count messages.create reports; earlier turns' thinking blocks stay out of the prompt,
    as Anthropic strips them."""
    import anthropic
    from anthropic.types import MessageTokensCount

    import llamay

    model = llamay.load(tools_path)
    client = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    kw = dict(model="tools", messages=msgs, system="Be brief.", tools=[WEATHER])
    raw = httpx.post(f"{srv.url}/v1/messages/count_tokens", json=kw)
    n = MessageTokensCount.model_validate_json(raw.text, strict=True).input_tokens
    fn = {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    text = model.tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, *msgs],
        tools=[{"type": "function", "function": fn}],
        add_generation_prompt=True,
    )
    assert "get_weather" in text
    assert n == len(model.tokenize(text, parse_special=True))
    created = client.messages.create(max_tokens=1, **kw)
    assert created.usage.input_tokens + created.usage.cache_read_input_tokens == n
    without = client.messages.count_tokens(model="tools", messages=msgs, system="Be brief.")
    assert without.input_tokens < n
    # SmolLM2's template has no tools: they are described in the system prompt, counted
    tiny_kw = {**kw, "model": "tiny"}
    n_tiny = client.messages.count_tokens(**tiny_kw).input_tokens
    bare = client.messages.count_tokens(model="tiny", messages=msgs, system="Be brief.")
    assert n_tiny > bare.input_tokens + len(tiny.tokenize(json.dumps(WEATHER["input_schema"])))
    u = client.messages.create(max_tokens=1, **tiny_kw).usage
    assert u.input_tokens + u.cache_read_input_tokens == n_tiny
    # thinking blocks in the history: accepted, and not part of the prompt
    history = [
        *msgs,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Call the tool? " * 20, "signature": "s"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Sunny."},
            ],
        },
        {"role": "user", "content": "Thanks."},
    ]
    plain = [*history[:1], {"role": "assistant", "content": "Sunny."}, history[2]]
    with_thinking = client.messages.count_tokens(model="tiny", messages=history).input_tokens
    assert with_thinking == client.messages.count_tokens(model="tiny", messages=plain).input_tokens


# --- /metrics: latency histograms, read with a strict parser of the exposition format ---

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_VALUE = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|Inf|NaN)"


def parse_exposition(text: str) -> dict[str, dict]:
    """Prometheus's text format (version 0.0.4), strictly: {family: {"type", "help",
    "samples": [(name, {label: value}, float)]}}. Raises AssertionError on any line that
    is not a HELP, TYPE or sample line of a declared family, on a repeated series, and on
    a histogram whose buckets are not cumulative up to le="+Inf" == _count."""
    import re

    sample = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? ({_VALUE})$")
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
    families: dict[str, dict] = {}
    seen: set = set()
    assert text.endswith("\n"), "the exposition must end with a line feed"
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert re.fullmatch(_NAME, name), line
            fam = families.setdefault(name, {"samples": []})
            assert "help" not in fam, f"second HELP for {name}"
            fam["help"] = doc
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            fam = families.setdefault(name, {"samples": []})
            assert "type" not in fam and not fam["samples"], f"TYPE of {name} late or twice"
            fam["type"] = kind
        else:
            m = sample.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels_text, value = m.groups()
            labels = dict(label.findall(labels_text or ""))
            fam_name = name
            for suffix in ("_bucket", "_sum", "_count"):
                base = name.removesuffix(suffix)
                if base != name and families.get(base, {}).get("type") == "histogram":
                    fam_name = base
            assert fam_name in families and "type" in families[fam_name], f"undeclared {name}"
            key = (name, tuple(sorted(labels.items())))
            assert key not in seen, f"repeated series {key}"
            seen.add(key)
            families[fam_name]["samples"].append((name, labels, float(value.replace("Inf", "inf"))))
    for fam_name, fam in families.items():
        if fam.get("type") != "histogram":
            continue
        series: dict = {}
        for name, labels, v in fam["samples"]:
            rest = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            series.setdefault(rest, {"buckets": []})
            if name.endswith("_bucket"):
                series[rest]["buckets"].append((float(labels["le"].replace("Inf", "inf")), v))
            else:
                series[rest][name.rsplit("_", 1)[1]] = v
        for rest, s in series.items():
            les = [le for le, _ in s["buckets"]]
            counts = [c for _, c in s["buckets"]]
            assert les == sorted(les) and les[-1] == float("inf"), (fam_name, rest, les)
            assert counts == sorted(counts), f"{fam_name}{rest}: buckets not cumulative"
            assert counts[-1] == s["count"] and "sum" in s, (fam_name, rest)
    return families


def _histograms(http) -> dict[str, dict[str, dict]]:
    """{family: {model: {"count", "sum", "buckets": {le: n}}}} of the latency families."""
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    fams = parse_exposition(r.text)
    out: dict[str, dict[str, dict]] = {}
    for fam in LATENCY:
        assert fams[fam]["type"] == "histogram" and fams[fam]["help"]
        per: dict[str, dict] = {}
        for name, labels, v in fams[fam]["samples"]:
            d = per.setdefault(labels["model"], {"buckets": {}})
            if name.endswith("_bucket"):
                d["buckets"][labels["le"]] = v
            else:
                d[name.rsplit("_", 1)[1]] = v
        out[fam] = per
    return out


LATENCY = (
    "llamay_time_to_first_token_seconds",
    "llamay_time_per_output_token_seconds",
    "llamay_request_queue_time_seconds",
)


def test_metrics_latency_histograms_per_model(http, srv):
    import time

    from tests.serve.conftest import wait_idle

    wait_idle(srv.state)
    before = _histograms(http)
    walls = {"tiny": [], "fim": []}
    for model, n in (("tiny", 3), ("fim", 1)):
        for _ in range(n):
            t = time.perf_counter()
            body = {"model": model, "prompt": "Once upon", "max_tokens": 4, "temperature": 0}
            r = http.post("/v1/completions", json=body)
            walls[model].append(time.perf_counter() - t)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    wait_idle(srv.state)
    after = _histograms(http)

    def delta(fam, model, key):
        return after[fam][model][key] - before.get(fam, {}).get(model, {}).get(key, 0.0)

    for model, ws in walls.items():
        for fam in LATENCY:
            assert delta(fam, model, "count") == len(ws), (fam, model)
        # each request's first token and its queue wait came within its wall time
        ttft = delta("llamay_time_to_first_token_seconds", model, "sum")
        queue = delta("llamay_request_queue_time_seconds", model, "sum")
        assert 0 < ttft <= sum(ws) and 0 <= queue <= ttft
        # 3 tokens after the first, in what was left of the wall time
        tpot = delta("llamay_time_per_output_token_seconds", model, "sum")
        assert 0 < tpot <= (sum(ws) - ttft) / 3 + 1e-6
    # the label sets are exactly the models that generated
    assert set(after["llamay_time_to_first_token_seconds"]) <= {"tiny", "fim", "tools"}


def test_exposition_parser_refuses_malformed_text():
    """The parser the metrics test relies on fails on what the format forbids."""
    ok = (
        "# HELP h_seconds x\n# TYPE h_seconds histogram\n"
        'h_seconds_bucket{model="a",le="1.0"} 1\nh_seconds_bucket{model="a",le="+Inf"} 2\n'
        'h_seconds_sum{model="a"} 1.5\nh_seconds_count{model="a"} 2\n'
    )
    assert parse_exposition(ok)["h_seconds"]["type"] == "histogram"
    bad = [
        ok.replace('le="+Inf"} 2', 'le="+Inf"} 0'),  # not cumulative
        ok.replace('h_seconds_count{model="a"} 2', 'h_seconds_count{model="a"} 3'),
        ok.replace('le="+Inf"', 'le="2.0"'),  # no +Inf bucket
        ok + "undeclared_total 1\n",
        ok + 'h_seconds_sum{model="a"} 1.5\n',  # a repeated series
        ok.replace('model="a"', "model=a"),
        ok[:-1],  # no final line feed
    ]
    for text in bad:
        with pytest.raises(AssertionError):
            parse_exposition(text)


def test_stored_function_call_continues_like_the_explicit_conversation(srv):
    """A stored response that called a function, continued with the call's output by
    previous_response_id, is the conversation sent in full as input items (OpenAI's
    equivalence), token for token; a call cut off before its name is stored too."""
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": WEATHER["input_schema"],
    }
    kw = dict(model="tiny", temperature=0, tools=[tool])
    r1 = client.responses.create(input="Weather in Paris?", tool_choice="required", **kw)
    call = r1.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    r2 = client.responses.create(input=[out], previous_response_id=r1.id, max_output_tokens=4, **kw)
    full = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        out,
    ]
    r3 = client.responses.create(input=full, max_output_tokens=4, **kw)
    assert r2.usage.input_tokens == r3.usage.input_tokens
    assert r2.output_text == r3.output_text
    cut = client.responses.create(input="Hi", tool_choice="required", max_output_tokens=3, **kw)
    assert cut.status == "incomplete" and client.responses.retrieve(cut.id).id == cut.id


def test_stored_input_items_list_as_the_cursor_page(srv):
    """`client.responses.input_items.list`: the request's input items, newest first by
    default, OpenAI's cursor page (limit, after, has_more), strictly typed."""
    from openai.types.responses import ResponseItemList

    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
    given = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        {"role": "user", "content": [{"type": "input_text", "text": "And?"}]},
    ]
    r = client.responses.create(model="tiny", input=given, max_output_tokens=2, temperature=0)
    raw = httpx.get(f"{srv.url}/v1/responses/{r.id}/input_items", params={"order": "asc"})
    page = ResponseItemList.model_validate_json(raw.text, strict=True)
    assert [x.type for x in page.data] == [
        "message",
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert [getattr(x, "role", None) for x in page.data] == [
        "developer",
        "user",
        "assistant",
        None,
        None,
        "user",
    ]
    assert page.data[2].content[0].text == "Hello!" and page.data[4].output == "42"
    assert page.data[5].content[0].text == "And?" and not page.has_more
    newest = client.responses.input_items.list(r.id)  # default: desc
    assert [x.id for x in newest.data] == [x.id for x in page.data][::-1]
    first = client.responses.input_items.list(r.id, order="asc", limit=4)
    assert first.has_more and [x.id for x in first.data] == [x.id for x in page.data[:4]]
    rest = client.responses.input_items.list(r.id, order="asc", limit=4, after=first.last_id)
    assert not rest.has_more and [x.id for x in rest.data] == [x.id for x in page.data[4:]]
    s = client.responses.create(model="tiny", input="Plain", max_output_tokens=2)
    (only,) = client.responses.input_items.list(s.id).data
    assert only.role == "user" and only.content[0].text == "Plain"
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_unknown")


def test_ollama_api_md_suffix_example_as_curl_sends_it(http, fim_model):
    """api.md's "Request (with suffix)" byte for byte as curl -d sends it (no
    Content-Type, no token limit: to the model's end or the server's cap of 256)."""
    body = (
        '{\n  "model": "fim",\n  "prompt": "def compute_gcd(a, b):",\n'
        '  "suffix": "    return result",\n  "options": {\n    "temperature": 0\n  },\n'
        '  "stream": false\n}'
    )
    r = http.post(
        "/api/generate",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200, r.text
    out = GenerateResponse.model_validate_json(r.text, strict=True)
    assert out.done and out.done_reason in ("stop", "length")
    ids, want = _fim_oracle(
        fim_model, "def compute_gcd(a, b):", "    return result", out.eval_count
    )
    assert out.response == want and out.prompt_eval_count == len(ids)
    assert out.eval_count == 256 or out.done_reason == "stop"
