"""Ollama's Modelfile `ADAPTER` with llama.cpp GGUF LoRA adapters (tests/fixtures/lora's,
on the tiny llama): `llamay create` stores the adapter as an
`application/vnd.ollama.image.adapter` layer and the model applies it when loaded
(`llamay.load`, `library.load`, the server), equal to `load(base, lora=[(adapter, 1)])`;
`/api/create` over loopback (the official ollama client) takes it only as an uploaded blob."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from fixture_data import FIXTURES, fixture_module, oracle, tiny_model_file
from typer.testing import CliRunner

import llamay
import llamay.store as store
from llamay import library
from llamay.errors import AdapterError, InvalidModelNameError, ModelNotFoundError
from llamay.files import sha256_file
from llamay.store import manifest as media
from llamay.store.modelfile import parse

LORA = FIXTURES / "lora"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A directory with the tiny llama (tiny.gguf) and its adapters (wide.gguf, narrow.gguf)."""
    oracle("gguf")
    mk = fixture_module("lora", "make_lora.py")
    d = tmp_path_factory.mktemp("modelfile")
    base = tiny_model_file("llama")
    (d / "tiny.gguf").write_bytes(base.read_bytes())
    paths = mk.write_adapters(base, "tiny-llama", d)
    gold = np.load(LORA / "tiny-llama.llamacpp.npz")
    for name, path in paths.items():
        assert mk.sha256(path) == str(gold[f"sha256_{name}"]), name
    return d


@pytest.fixture(scope="module")
def want(files):
    """What the adapted model must give: the library path with the adapter at scale 1."""
    return llamay.load(files / "tiny.gguf", lora=[(files / "wide.gguf", 1.0)])


TOKENS = [1, 400, 401, 402, 403, 404, 405, 406, 407, 408]


def test_parse_adapter_lines():
    mf = parse("FROM ./tiny.gguf\nADAPTER ./wide.gguf\nadapter @sha256:" + "a" * 64 + "\n")
    assert mf.adapters == ["./wide.gguf", "@sha256:" + "a" * 64]


def test_llamay_create_with_adapter_applies_it(env, files, want, monkeypatch):
    from llamay_cli.main import app

    monkeypatch.setenv("OLLAMA_MODELS", str(files / "no-ollama"))
    (files / "Modelfile").write_text("FROM ./tiny.gguf\nADAPTER ./wide.gguf\nSYSTEM hi\n")
    r = CliRunner().invoke(app, ["create", "tinylora:1", "-f", str(files / "Modelfile")])
    assert r.exit_code == 0, r.output
    (entry,) = store.list_models()
    layers = [(x.media_type, x.digest) for x in entry.manifest.layers]
    assert (media.ADAPTER, "sha256:" + sha256_file(files / "wide.gguf")) in layers
    assert [x.media_type for x in entry.manifest.layers][:2] == [media.MODEL, media.ADAPTER]
    got = llamay.load("tinylora:1")
    assert [a.path for a in got.adapters] == entry.adapter_paths()
    ref = want.logits(TOKENS)
    np.testing.assert_allclose(got.logits(TOKENS), ref, atol=1e-5)
    assert np.abs(ref - want.with_lora([]).logits(TOKENS)).max() > 1  # the adapter matters
    m, om = library.load("tinylora:1")
    np.testing.assert_allclose(m.logits(TOKENS), ref, atol=1e-5)
    assert om.system == "hi" and not om.ignored_layers
    from llamay.ollama import to_modelfile

    shown = to_modelfile(om)  # `llamay modelfile`: the adapter's blob, as `ollama show`
    assert f"ADAPTER {entry.adapter_paths()[0]}\n" in shown
    assert parse(shown).adapters == [str(entry.adapter_paths()[0])]
    # a model made FROM it inherits the adapter layer
    store.create("tinylora:2", "FROM tinylora:1\nSYSTEM other\n", progress=False)
    np.testing.assert_allclose(llamay.load("tinylora:2").logits(TOKENS), ref, atol=1e-5)


def test_adapter_refusals(env, files):
    with pytest.raises(AdapterError, match="general.type is None, a LoRA adapter has 'adapter'"):
        store.create("bad:1", "FROM ./tiny.gguf\nADAPTER ./tiny.gguf\n", files, progress=False)
    store.create("base:1", "FROM ./tiny.gguf\n", files, progress=False)
    with pytest.raises(InvalidModelNameError, match="ADAPTER names an uploaded blob"):
        store.create(
            "bad:2",
            "FROM base:1\nADAPTER ./wide.gguf\n",
            files,
            progress=False,
            allow_local_files=False,
        )
    with pytest.raises(ModelNotFoundError, match="is not a file"):
        store.create("bad:3", "FROM ./tiny.gguf\nADAPTER ./none.gguf\n", files, progress=False)
    with pytest.raises(ModelNotFoundError, match="no such blob"):
        store.create("bad:4", f"FROM base:1\nADAPTER @sha256:{'0' * 64}\n", progress=False)
    assert [m.name for m in store.list_models()] == ["base:1"]


def test_api_create_with_an_uploaded_adapter(env, files, want):
    ollama = oracle("ollama")
    from llamay.serve import create_app
    from llamay.serve.models import Models
    from tests.serve.conftest import running

    app = create_app(Models({}, use_store=True, default_keep_alive=-1))
    with running(app) as s:
        c = ollama.Client(host=s.url, timeout=300)
        base = c.create_blob(files / "tiny.gguf")
        wide = c.create_blob(files / "wide.gguf")
        c.create(model="srvlora", files={"tiny.gguf": base}, adapters={"wide.gguf": wide})
        r = c.generate(
            model="srvlora",
            prompt="Once upon a time",
            raw=True,
            options={"temperature": 0, "num_predict": 6},
        )
        assert r.response == want.generate("Once upon a time", max_tokens=6, temperature=0)
        assert r.response != want.with_lora([]).generate(
            "Once upon a time", max_tokens=6, temperature=0
        )
        # a server takes adapters as uploaded blobs only: no paths on its machine
        for body, message in [
            (
                {"model": "evil", "modelfile": f"FROM srvlora\nADAPTER {files / 'wide.gguf'}\n"},
                "ADAPTER names an uploaded blob",
            ),
            ({"model": "evil", "from": "srvlora", "adapters": {"x.gguf": "/etc/passwd"}}, "sha256"),
            ({"model": "evil", "from": "srvlora", "adapters": {"x.gguf": base}}, "general.type"),
        ]:
            resp = httpx.post(s.url + "/api/create", json={**body, "stream": False}, timeout=60)
            assert resp.status_code == 400, resp.text
            assert message in resp.json()["error"]
    assert [m.name for m in store.list_models()] == ["srvlora:latest"]
