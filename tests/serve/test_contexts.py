"""llamay's context API over httpx against the real server: a context's continuation equals
`Model.generation` of its whole token sequence (greedy), its KV stays in the engine (the
engine's computed-token counter shows only new tokens are computed), forks are independent
but share the prefix, snapshots carry the KV to disk and back."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from llamay.sample import GREEDY
from tests.serve.conftest import wait_idle

WORDS = " ".join(f"word{i}" for i in range(40))  # several KV pages


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c
        for ctx in c.get("/v1/contexts").json()["data"]:
            c.delete(f"/v1/contexts/{ctx['id']}")


def computed(server) -> int:
    """Tokens the tiny model's engine has run through the model so far."""
    return wait_idle(server.state)["tiny"]["computed_tokens"]


def gen(http, cid, **body):
    r = http.post(f"/v1/contexts/{cid}/generate", json={"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_continuation_equals_generate_and_computes_only_new_tokens(http, server, tiny):
    c = http.post("/v1/contexts", json={"model": "tiny", "text": "Once upon"}).json()
    assert c["tokens"] == tiny.tokenize("Once upon", parse_special=True)
    assert c["kv_tokens"] == c["n_tokens"]  # computed at creation, kept in the engine
    c = http.post(f"/v1/contexts/{c['id']}/append", json={"text": " a time"}).json()
    assert c["kv_tokens"] == c["n_tokens"]
    prompt = c["tokens"]

    before = computed(server)
    g1 = gen(http, c["id"], max_tokens=5)
    # the last prompt token again (for its logits), then each token fed back but the last
    assert computed(server) - before == 5
    assert g1["usage"]["cached_tokens"] == len(prompt) - 1

    before = computed(server)
    g2 = gen(http, c["id"], max_tokens=4)
    assert computed(server) - before == 4
    assert g1["tokens"] + g2["tokens"] == list(tiny.generation(prompt, 9, GREEDY))
    assert g1["text"] + g2["text"] == tiny.generate("Once upon a time", 9, temperature=0)

    before = computed(server)
    more = tiny.tokenize(" The end", add_special=False, parse_special=True)
    c = http.post(f"/v1/contexts/{c['id']}/append", json={"tokens": more}).json()
    assert computed(server) - before == len(more) + 1
    g3 = gen(http, c["id"], max_tokens=3)
    assert g3["tokens"] == list(tiny.generation(c["tokens"], 3, GREEDY))
    assert http.delete(f"/v1/contexts/{c['id']}").status_code == 204


def test_forks_are_independent_and_share_the_prefix(http, server, tiny):
    c = http.post("/v1/contexts", json={"model": "tiny", "text": WORDS}).json()
    parent = c["tokens"]
    assert len(parent) >= 40
    a, b, d = http.post(f"/v1/contexts/{c['id']}/fork", json={"n": 3}).json()["data"]
    assert a["n_tokens"] == b["n_tokens"] == d["n_tokens"] == len(parent)

    before = computed(server)
    ga = gen(http, a["id"], max_tokens=4)
    gb = gen(http, b["id"], max_tokens=4)
    # each child computed its own tokens only: the 40-odd prefix tokens were not recomputed
    assert computed(server) - before == 8
    assert ga["tokens"] == gb["tokens"] == list(tiny.generation(parent, 4, GREEDY))
    assert gb["usage"]["cached_tokens"] == len(parent) - 1

    # a child's appends and generations change neither its parent nor its siblings
    tail = tiny.tokenize(" word7 word7", add_special=False, parse_special=True)
    http.post(f"/v1/contexts/{d['id']}/append", json={"tokens": tail})
    gd = gen(http, d["id"], max_tokens=4)
    assert gd["tokens"] == list(tiny.generation(parent + tail, 4, GREEDY))
    assert http.get(f"/v1/contexts/{c['id']}").json()["tokens"] == parent
    ga2 = gen(http, a["id"], max_tokens=2)
    assert ga["tokens"] + ga2["tokens"] == list(tiny.generation(parent, 6, GREEDY))
    gc = gen(http, c["id"], max_tokens=4)
    assert gc["tokens"] == ga["tokens"]

    for x in (c, a, b, d):
        assert http.delete(f"/v1/contexts/{x['id']}").status_code == 204
    stats = wait_idle(server.state)["tiny"]
    assert stats["pages_held"] == 0 and stats["kept"] == 0  # deleting frees the KV


def test_streaming_generate(http, tiny):
    c = http.post("/v1/contexts", json={"model": "tiny", "text": "Hello"}).json()
    with http.stream(
        "POST",
        f"/v1/contexts/{c['id']}/generate",
        json={"max_tokens": 6, "temperature": 0, "stream": True},
    ) as r:
        datas = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    last = datas[-1]
    assert last["done"] and last["n_tokens"] == c["n_tokens"] + 6
    assert "".join(d["text"] for d in datas[:-1]) == tiny.generate("Hello", 6, temperature=0)
    shown = http.get(f"/v1/contexts/{c['id']}").json()
    assert shown["kv_tokens"] == shown["n_tokens"]
    http.delete(f"/v1/contexts/{c['id']}")


def test_snapshot_carries_the_kv(http, server, tiny, serve_home):
    def kv_files() -> set:
        return set((serve_home / "kv").glob("*.kv.npz"))

    others = kv_files()  # other tests' snapshots in the same store
    c = http.post("/v1/contexts", json={"model": "tiny", "text": WORDS}).json()
    g = gen(http, c["id"], max_tokens=5)
    tokens = c["tokens"] + g["tokens"]
    snap = http.post(f"/v1/contexts/{c['id']}/snapshot", json={"name": "s1"}).json()
    assert snap["n_tokens"] == len(tokens) and snap["kv_tokens"] == len(tokens) - 1
    assert "s1" in [s["name"] for s in http.get("/v1/snapshots").json()["data"]]
    http.delete(f"/v1/contexts/{c['id']}")

    before = computed(server)
    r = http.post("/v1/contexts", json={"snapshot": "s1"}).json()
    assert r["tokens"] == tokens and r["kv_tokens"] == len(tokens)
    g2 = gen(http, r["id"], max_tokens=3)
    # restoring computed one token (the last, never fed), not the whole sequence
    assert computed(server) - before == 1 + 3
    assert g["tokens"] + g2["tokens"] == list(tiny.generation(c["tokens"], 8, GREEDY))

    # the same context under a second name shares the KV file; deleting one keeps it
    http.post(f"/v1/contexts/{r['id']}/snapshot", json={"name": "s2"})
    http.post(f"/v1/contexts/{r['id']}/snapshot", json={"name": "s3"})
    assert len(kv_files() - others) == 2  # s1's, and s2 = s3's
    assert http.delete("/v1/snapshots/s2").status_code == 204
    assert len(kv_files() - others) == 2
    assert http.delete("/v1/snapshots/s3").status_code == 204
    assert http.delete("/v1/snapshots/s1").status_code == 204
    assert kv_files() == others
    assert http.delete(f"/v1/contexts/{r['id']}").status_code == 204


def test_errors(http):
    assert http.post("/v1/contexts", json={"snapshot": "../x"}).status_code == 400
    assert http.post("/v1/contexts", json={"snapshot": "nope"}).status_code == 404
    assert http.get("/v1/contexts/ctx_nope").status_code == 404
    r = http.post("/v1/contexts", json={"model": "tiny", "tokens": [10**9]})
    assert r.status_code == 400 and "vocabulary" in r.text
    c = http.post("/v1/contexts", json={"model": "tiny", "text": "x"}).json()
    r = http.post(f"/v1/contexts/{c['id']}/generate", json={"max_tokens": 5, "bogus": 1})
    assert r.status_code == 400 and "bogus" in r.text
    r = http.post(f"/v1/contexts/{c['id']}/append", json={"tokens": [1] * 5000})
    assert r.status_code == 400 and "context" in r.text
    assert http.get(f"/v1/contexts/{c['id']}").json()["tokens"] == c["tokens"]
    http.delete(f"/v1/contexts/{c['id']}")


def metric(http, name: str) -> float:
    """One value of the server's /metrics (Prometheus text)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_contexts_expire_and_are_capped(tiny_paths, serve_home):
    """Issue 22 item 8: contexts unused for the TTL are deleted (their KV pages freed), at
    most max_contexts live at once, both reported in /metrics."""
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from tests.serve.conftest import running

    app = create_app(Models({"tiny": tiny_paths["tiny"]}, use_store=False, default_keep_alive=-1))
    st = app.state.llamay
    st.context_ttl_s, st.max_contexts = 2.0, 3
    with running(app) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        ids = []
        for i in range(3):
            r = c.post("/v1/contexts", json={"model": "tiny", "text": f"{WORDS} {i}"})
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        held = wait_idle(st)["tiny"]["pages_held"]
        assert held > 0  # the contexts' KV
        r = c.post("/v1/contexts", json={"model": "tiny", "text": "one more"})
        assert r.status_code == 429 and "at most 3" in r.json()["error"]["message"]
        r = c.post(f"/v1/contexts/{ids[0]}/fork", json={"n": 1})
        assert r.status_code == 429
        assert metric(c, "llamay_contexts") == 3 and metric(c, "llamay_contexts_max") == 3
        # one kept in use, two left alone past the TTL
        for _ in range(4):
            time.sleep(0.75)
            assert c.get(f"/v1/contexts/{ids[0]}").status_code == 200
        assert c.get(f"/v1/contexts/{ids[1]}").status_code == 404
        assert [x["id"] for x in c.get("/v1/contexts").json()["data"]] == [ids[0]]
        assert metric(c, "llamay_contexts") == 1
        assert metric(c, "llamay_contexts_expired_total") == 2
        assert metric(c, "llamay_context_ttl_seconds") == 2
        assert 0 < wait_idle(st)["tiny"]["pages_held"] < held  # the expired ones' KV freed
        assert c.post("/v1/contexts", json={"model": "tiny", "text": "now"}).status_code == 200
