"""Reading an Ollama-layout store: finding it, listing, name resolution, layers, params,
templates; and generating from the real SmolLM2 blob through it."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from fixture_data import tiny_model_file
from ollama_layout import OllamaLayout, go_json
from typer.testing import CliRunner

import llamay.ollama as ollama
from llamay import library
from llamay.errors import ModelNotFoundError
from llamay.ollama import OllamaStoreError, SamplerDefaults, UnsupportedTemplateError
from llamay.ollama.params import cut_at_stops
from llamay.ollama.template import render

#: The registry host directory (Ollama's default host in a real store; any host works).
HOST = "registry.example"

CHATML = (
    "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "<|im_start|>user\n{{ .Prompt }}<|im_end|>\n<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)
PARAMS = {"stop": ["<|im_start|>", "<|im_end|>"], "temperature": 0.0, "num_predict": 24}


@pytest.fixture(scope="module")
def tiny() -> Path:
    """Built before a test points LLAMAY_HOME elsewhere (it reads the real store)."""
    return tiny_model_file("llama")


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OllamaLayout:
    root = tmp_path / "ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return OllamaLayout(root)


# --- finding and listing -----------------------------------------------------------------


def test_find_store_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    if Path("/usr/share/ollama/.ollama/models/manifests").is_dir():
        pytest.skip("a system Ollama store exists on this machine")
    assert ollama.find_store() is None
    assert ollama.list_models() == []
    with pytest.raises(ModelNotFoundError, match="no Ollama store found.*OLLAMA_MODELS"):
        ollama.resolve("x")
    (home / ".ollama/models/manifests").mkdir(parents=True)
    assert ollama.find_store() == home / ".ollama/models"
    env_store = tmp_path / "elsewhere"
    (env_store / "manifests").mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(env_store))
    assert ollama.find_store() == env_store


def test_list_and_resolve(layout: OllamaLayout, tiny: Path) -> None:
    p1 = layout.model((HOST, "library", "tiny", "latest"), tiny, params={"temperature": 0.5})
    layout.model((HOST, "someone", "tiny", "q8"), tiny, system="Be brief.")
    layout.model(("127.0.0.1:5000", "library", "other", "1"), tiny, template="{{ .Prompt }}")
    models = ollama.list_models()
    assert [m.name for m in models] == ["other:1", "someone/tiny:q8", "tiny:latest"]
    m = ollama.resolve("tiny")
    assert m.full_name == ollama.FullName(HOST, "library", "tiny", "latest")
    assert m.manifest_path == p1
    assert m.model_path == layout.root / "blobs" / f"sha256-{m.digest[7:]}"
    assert m.model_path.samefile(tiny)  # linked, not copied
    assert m.params == {"temperature": 0.5} and m.template is None and m.system is None
    assert m.size == sum(x.size for x in m.manifest.blobs())
    for name in ["tiny:latest", "library/tiny", f"{HOST}/library/tiny:latest", "TINY:Latest"]:
        assert ollama.resolve(name).full_name == m.full_name
    assert ollama.resolve("someone/tiny:q8").system == "Be brief."
    assert ollama.resolve("127.0.0.1:5000/library/other:1").template == "{{ .Prompt }}"
    with pytest.raises(ModelNotFoundError, match="it has: other:1, someone/tiny:q8, tiny:latest"):
        ollama.resolve("tiny:q8")
    for evil in ["../tiny", "library/../../x", "/etc/passwd", "a/b/c/d", ""]:
        with pytest.raises(ModelNotFoundError):
            ollama.resolve(evil)


def test_same_short_name_on_two_hosts(layout: OllamaLayout, tiny: Path) -> None:
    layout.model((HOST, "library", "tiny", "latest"), tiny)
    layout.model(("mirror.example", "library", "tiny", "latest"), tiny)
    names = [m.name for m in ollama.list_models()]
    assert names == ["mirror.example/library/tiny:latest", f"{HOST}/library/tiny:latest"]
    with pytest.raises(ModelNotFoundError, match="ambiguous"):
        ollama.resolve("tiny")
    assert ollama.resolve("mirror.example/library/tiny").full_name.host == "mirror.example"


def test_broken_models_are_skipped_with_a_warning(layout: OllamaLayout, tiny: Path) -> None:
    layout.model((HOST, "library", "good", "latest"), tiny)
    bad = layout.model((HOST, "library", "noblob", "latest"), tiny, system="s")
    man = json.loads(bad.read_text())
    man["layers"][0]["digest"] = "sha256:" + "1" * 64
    bad.write_bytes(go_json(man))
    garbage = layout.root / "manifests" / HOST / "library" / "garbage" / "latest"
    garbage.parent.mkdir(parents=True)
    garbage.write_text("{not json")
    with pytest.warns(UserWarning) as record:
        assert [m.name for m in ollama.list_models()] == ["good:latest"]
    text = " ".join(str(w.message) for w in record)
    assert "missing from the Ollama store" in text and "not valid JSON" in text
    with pytest.raises(OllamaStoreError, match="missing"):
        ollama.resolve("noblob")


def test_manifest_bytes_are_ollamas(layout: OllamaLayout, tiny: Path) -> None:
    """Our manifest writer and Ollama's produce the same bytes for the same manifest."""
    path = layout.model((HOST, "library", "tiny", "latest"), tiny, params=PARAMS)
    m = ollama.resolve("tiny")
    assert m.manifest.dumps() == path.read_bytes()
    raw = (
        layout.root
        / "blobs"
        / m.manifest.layer("application/vnd.ollama.image.params").digest.replace(":", "-")
    ).read_bytes()
    assert b"\\u003c|im_start|\\u003e" in raw  # Go escapes < and >
    assert m.params == PARAMS


# --- params and templates --------------------------------------------------------------------


def test_params_become_sampler_defaults() -> None:
    d = SamplerDefaults.from_params(
        {
            "temperature": 0.2,
            "top_k": 20,
            "top_p": 0.8,
            "min_p": 0.1,
            "seed": 7,
            "num_predict": 42,
            "num_ctx": 4096,
            "stop": ["<|im_end|>", ""],
        }
    )
    assert d.generate_kwargs() == {
        "temperature": 0.2,
        "top_k": 20,
        "top_p": 0.8,
        "min_p": 0.1,
        "seed": 7,
        "max_tokens": 42,
    }
    assert d.n_ctx == 4096 and d.stop == ("<|im_end|>",)
    d = SamplerDefaults.from_params({"num_predict": -1, "seed": -1, "stop": "x"})
    assert d.generate_kwargs() == {} and d.stop == ("x",)
    with pytest.warns(UserWarning, match="repeat_penalty.*not supported"):
        d = SamplerDefaults.from_params({"repeat_penalty": 1.1})
    assert d.unsupported == {"repeat_penalty": 1.1}
    for bad in [
        {"temperature": "hot"},
        {"top_k": 1.5},
        {"stop": [1]},
        {"temperature": True},
        {"top_p": float("nan")},
    ]:
        with pytest.raises(OllamaStoreError):
            SamplerDefaults.from_params(bad)


@pytest.mark.parametrize(
    ("pieces", "stops", "out"),
    [
        (["Hello", " wor", "ld"], [], "Hello world"),
        (["Hello<|im", "_end|>more"], ["<|im_end|>"], "Hello"),
        (["a<", "b"], ["<|"], "a<b"),
        (["<|im_end|>x"], ["<|im_end|>"], ""),
        (["abc", "STOP", "def"], ["STOP", "bc"], "a"),
        (["x<|i"], ["<|im_end|>"], "x<|i"),
    ],
)
def test_cut_at_stops(pieces: list[str], stops: list[str], out: str) -> None:
    assert "".join(cut_at_stops(iter(pieces), stops)) == out


def test_cut_at_stops_closes_the_generator() -> None:
    closed = []

    def gen():
        try:
            yield from ["a", "STOP", "b", "c"]
        finally:
            closed.append(True)

    assert "".join(cut_at_stops(gen(), ["STOP"])) == "a"
    assert closed == [True]


def test_template_subset() -> None:
    assert render(CHATML, "Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(CHATML, "Hi", "Sys") == (
        "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render("{{ if .System }}S{{ else }}N{{ end }}: {{ .Prompt }}", "p") == "N: p"
    assert render("A  {{- .Prompt -}}  B", "p") == "ApB"
    for bad in [
        "{{- range .Messages }}{{ .Content }}{{ end }}",
        "{{ .Prompt | upper }}",
        "{{ if .Prompt }}x",
        "{{ end }}",
        "{{ $x := 1 }}",
    ]:
        with pytest.raises(UnsupportedTemplateError):
            render(bad, "p")


def test_format_prompt_falls_back_on_unsupported_templates(layout, tiny) -> None:
    layout.model((HOST, "library", "t", "1"), tiny, template="{{ range .Messages }}{{ end }}")
    om = ollama.resolve("t:1")
    with pytest.warns(UserWarning, match="template subset"):
        assert ollama.format_prompt(om, "hi") == "hi"


# --- the CLI lists them, marked ------------------------------------------------------------


def test_cli_list_marks_ollama_models(layout, tiny, tmp_path, monkeypatch) -> None:
    from llamay_cli.main import app

    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "llamay-home"))
    layout.model((HOST, "library", "tiny", "latest"), tiny)
    r = CliRunner().invoke(app, ["list"])
    assert r.exit_code == 0, r.output
    assert "tiny:latest (ollama)" in r.stdout
    r = CliRunner().invoke(app, ["list", "--no-ollama"])
    assert "(ollama)" not in r.stdout


# --- the real SmolLM2 blob, through an Ollama store -------------------------------------------


@pytest.mark.model
def test_generate_from_ollama_store(layout: OllamaLayout, smollm2_path: Path) -> None:
    import llamay

    layout.model(
        (HOST, "library", "smollm2", "135m"),
        smollm2_path,
        digest="sha256:" + smollm2_path.name.removeprefix("sha256-"),
        template=CHATML,
        system="You are a helpful assistant.",
        params=PARAMS,
        license="Apache License 2.0",
    )
    [listed] = ollama.list_models()
    assert listed.name == "smollm2:135m" and listed.license == ("Apache License 2.0",)
    model, om = library.load("smollm2:135m")
    assert os.path.samefile(model.path, smollm2_path)  # run in place from the blob

    # the template and system layers format the prompt
    prompt = ollama.format_prompt(om, "What is the capital of France?")
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert prompt.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    # the params layer: greedy (temperature 0), at most 24 tokens, stop strings cut the text
    out = ollama.generate(model, om, "What is the capital of France?")
    reference = llamay.load(smollm2_path).generate(prompt, max_tokens=24, temperature=0.0)
    cut = min((reference.find(s) for s in PARAMS["stop"] if s in reference), default=None)
    assert out == (reference if cut is None else reference[:cut])
    assert "Paris" in out
    assert ollama.generate(model, om, "What is the capital of France?", max_tokens=3) != out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ollama.generate(model, om, "Hi", raw=True, max_tokens=2)


def test_library_resolve_falls_back_to_ollama(layout, tiny, tmp_path, monkeypatch) -> None:
    import llamay.store as store

    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "llamay-home"))
    layout.model((HOST, "someone", "tiny", "q8"), tiny)
    path = library.resolve("someone/tiny:q8", progress=False)
    assert path.samefile(tiny) and path.parent == layout.root / "blobs"
    assert not (tmp_path / "llamay-home").exists()  # nothing copied, nothing written
    with pytest.raises(ModelNotFoundError, match="unknown model 'someone/other:latest'"):
        library.resolve("someone/other", progress=False)
    # llamay's own store alone does not know Ollama's models
    with pytest.raises(ModelNotFoundError, match="unknown model 'someone/tiny:q8'"):
        store.resolve("someone/tiny:q8", progress=False)


def test_cli_show_includes_ollama_layers(layout, tiny, tmp_path, monkeypatch) -> None:
    """`llamay show` of an Ollama model lists its template, system, params and license
    layers, as `ollama show` does; the GGUF facts come from the blob."""
    from llamay_cli.main import app

    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "llamay-home"))
    layout.model(
        (HOST, "library", "tiny", "latest"),
        tiny,
        template=CHATML,
        system="Be brief.",
        params=PARAMS,
        license="MIT-ish",
    )
    r = CliRunner().invoke(app, ["show", "tiny", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["architecture"] == "llama"
    assert (info["template"], info["system"], info["license"]) == (CHATML, "Be brief.", "MIT-ish")
    assert info["parameters"] == PARAMS
    text = CliRunner().invoke(app, ["show", "tiny"]).stdout
    assert "system:\n  Be brief." in text and "license:\n  MIT-ish" in text
