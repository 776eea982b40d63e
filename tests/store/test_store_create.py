"""Modelfiles and `create`: parsing (a table of good and bad files), building a model's
layers from a GGUF path, from a stored model, and from an Ollama store; the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixture_data import tiny_model_file
from typer.testing import CliRunner

import llamay.store as store
from llamay import library
from llamay.errors import ModelNotFoundError
from llamay.store import manifest as media
from llamay.store.manifest import Manifest
from llamay.store.modelfile import ModelfileError, parse

GOOD = '''
# a comment
FROM ./tiny.gguf
TEMPLATE """{{ if .System }}[{{ .System }}] {{ end }}Q: {{ .Prompt }}
A:"""
system "Be terse."
PARAMETER temperature 0.25
PARAMETER stop "<|im_end|>"
PARAMETER stop END
parameter num_ctx 512
LICENSE """MIT
(c) nobody"""
'''


def test_parse_good() -> None:
    mf = parse(GOOD)
    assert mf.base == "./tiny.gguf"
    assert mf.template == "{{ if .System }}[{{ .System }}] {{ end }}Q: {{ .Prompt }}\nA:"
    assert mf.system == "Be terse."
    assert mf.params == {"temperature": 0.25, "stop": ["<|im_end|>", "END"], "num_ctx": 512}
    assert mf.licenses == ["MIT\n(c) nobody"]
    assert mf.params_json() == b'{"num_ctx":512,"stop":["<|im_end|>","END"],"temperature":0.25}\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SYSTEM hi", "no FROM"),
        ("FROM a\nFROM b", "line 2: more than one FROM"),
        ("FROM a\nBOGUS x", "line 2: unknown instruction BOGUS"),
        ("FROM a\nADAPTER", "line 2: ADAPTER needs"),
        ("FROM a\nMESSAGE user hi", "MESSAGE is not supported"),
        ("FROM a\nPARAMETER temperature hot", "line 2: PARAMETER temperature 'hot'"),
        ("FROM a\nPARAMETER top_k 1.5", "not a valid value"),
        ("FROM a\nPARAMETER wat 1", "unknown parameter 'wat'"),
        ("FROM a\nPARAMETER temperature", "needs a name and a value"),
        ('FROM a\nTEMPLATE """never closed', 'line 2: unterminated """'),
        ('FROM a\nTEMPLATE """x""" y', "text after the closing"),
        ("FROM a\n???", "line 2: cannot read"),
    ],
)
def test_parse_bad(text: str, message: str) -> None:
    with pytest.raises(ModelfileError, match=message):
        parse(text)


def _ollama_layout():
    """`OllamaLayout` from tests/ollama/ollama_layout.py (another test directory)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "ollama" / "ollama_layout.py"
    spec = importlib.util.spec_from_file_location("_ollama_layout_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OllamaLayout


@pytest.fixture(scope="module")
def tiny_src() -> Path:
    """Built (once) before `env` points LLAMAY_HOME/LLAMAY_CACHE at empty directories, so
    SmolLM2's tokenizer comes from the real store, not a download into the test's."""
    return tiny_model_file("llama")


@pytest.fixture
def tiny(tiny_src: Path, tmp_path: Path) -> Path:
    """The tiny llama GGUF next to a Modelfile directory."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.gguf").symlink_to(tiny_src)
    return work / "tiny.gguf"


def test_create_from_a_path(env, tiny, tmp_path, monkeypatch) -> None:
    import llamay.ollama as ollama

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    entry = store.create("mine:v1", GOOD, directory=tiny.parent, progress=False)
    assert entry.path.read_bytes() == tiny.read_bytes()
    assert not entry.path.samefile(tiny)  # copied into the store
    assert [x.media_type for x in entry.manifest.layers] == [
        media.MODEL,
        media.TEMPLATE,
        media.SYSTEM,
        media.PARAMS,
        media.LICENSE,
    ]
    assert entry.layer_path(media.SYSTEM).read_text() == "Be terse."
    config = json.loads(
        entry.path.parent.joinpath(f"sha256-{entry.manifest.config.hex}").read_text()
    )
    assert config["model_format"] == "gguf" and config["model_family"] == "llama"
    # its layers take effect through llamay.ollama
    om = library.layered_model("mine:v1")
    assert ollama.format_prompt(om, "hi") == "[Be terse.] Q: hi\nA:"
    assert om.sampler_defaults().n_ctx == 512 and om.sampler_defaults().stop == (
        "<|im_end|>",
        "END",
    )
    # a registry-style name gets an Ollama manifest; FROM a stored model inherits its layers
    child = store.create(
        "example.org/me/child:1", "FROM mine:v1\nPARAMETER top_k 5\nSYSTEM other", progress=False
    )
    raw = (env.home / "manifests/example.org/me/child/1").read_bytes()
    assert Manifest.loads(raw).dumps() == raw
    params = json.loads(child.layer_path(media.PARAMS).read_text())
    assert params == {
        "num_ctx": 512,
        "stop": ["<|im_end|>", "END"],
        "temperature": 0.25,
        "top_k": 5,
    }
    assert child.layer_path(media.SYSTEM).read_text() == "other"
    assert child.layer_path(media.TEMPLATE) == entry.layer_path(media.TEMPLATE)
    # removing the parent keeps every blob the child uses
    store.remove("mine:v1")
    assert all(p.is_file() for p in [child.path, child.layer_path(media.TEMPLATE)])
    store.remove("example.org/me/child:1")
    assert env.files() == []


def test_create_from_an_ollama_model(env, tiny, tmp_path, monkeypatch) -> None:
    OllamaLayout = _ollama_layout()
    root = tmp_path / "ollama-models"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    OllamaLayout(root).model(
        ("registry.example", "library", "tiny", "latest"),
        tiny.resolve(),
        template="{{ .Prompt }}",
        params={"temperature": 0.5},
        license="L",
    )
    entry = library.create("fromollama:1", "FROM tiny\nPARAMETER seed 3", progress=False)
    assert entry.path.read_bytes() == tiny.read_bytes()
    assert json.loads(entry.layer_path(media.PARAMS).read_text()) == {"seed": 3, "temperature": 0.5}
    assert entry.layer_path(media.TEMPLATE).read_text() == "{{ .Prompt }}"
    assert entry.layer_path(media.LICENSE).read_text() == "L"


def test_create_errors(env, tiny, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    with pytest.raises(ModelNotFoundError, match="is not a file"):
        store.create("x:1", "FROM ./missing.gguf", directory=tmp_path, progress=False)
    with pytest.raises(ModelNotFoundError, match="unknown model 'nothere:latest'"):
        store.create("x:1", "FROM nothere", directory=tmp_path, progress=False)
    with pytest.raises(ModelfileError):
        store.create("x:1", "TEMPLATE x", directory=tmp_path, progress=False)
    assert store.list_models() == []


def test_cli_create(env, tiny, tmp_path, monkeypatch) -> None:
    from llamay_cli.main import app

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    (tiny.parent / "Modelfile").write_text(GOOD)
    r = CliRunner().invoke(app, ["create", "cli:1", "-f", str(tiny.parent / "Modelfile")])
    assert r.exit_code == 0, r.output
    assert "created 'cli:1'" in r.stdout
    assert [m.name for m in store.list_models()] == ["cli:1"]
    r = CliRunner().invoke(app, ["create", "cli:2", "-f", str(tmp_path / "nope")])
    assert r.exit_code == 1 and "cannot read the Modelfile" in r.stderr


def test_modelfile_round_trip_and_run(env, tiny, tmp_path, monkeypatch) -> None:
    """`llamay modelfile` prints what `create` reads back; `llamay run` applies the layers."""
    import llamay
    from llamay_cli.main import app

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    text = (
        'FROM ./tiny.gguf\nTEMPLATE "Q: {{ .Prompt }} A:"\nSYSTEM """two\nlines"""\n'
        'PARAMETER stop "\\n"\nPARAMETER stop "say \\"x\\""\nPARAMETER temperature 0\n'
        "PARAMETER num_predict 4\n"
    )
    store.create("orig:1", text, directory=tiny.parent, progress=False)
    r = CliRunner().invoke(app, ["modelfile", "orig:1"])
    assert r.exit_code == 0, r.output
    store.create("again:1", r.stdout, progress=False)
    a, b = library.layered_model("orig:1"), library.layered_model("again:1")
    assert (a.template, a.system, a.params) == (b.template, b.system, b.params)
    assert a.params["stop"] == ["\n", 'say "x"'] and a.system == "two\nlines"

    r = CliRunner().invoke(app, ["run", "orig:1", "hi"])
    assert r.exit_code == 0, r.output
    expected = llamay.load(tiny).generate("Q: hi A:", max_tokens=4, temperature=0.0)
    for stop in a.params["stop"]:
        expected = expected.split(stop)[0]
    assert r.stdout == expected + "\n"
    r = CliRunner().invoke(app, ["run", "nothere:1", "hi"])
    assert r.exit_code == 1 and "'nothere:1' is not a model with layers" in r.stderr


def test_run_a_model_without_layers(env, tiny, tmp_path, monkeypatch) -> None:
    """`llamay run` of a model without layers (the wheel-fetched default, a GGUF path) uses
    its GGUF chat template, as `ollama run` uses the template a pull brings (issue 19.10:
    `llamay run smollm2:135m` was refused)."""
    import llamay
    from llamay_cli.main import app

    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    r = CliRunner().invoke(app, ["run", str(tiny), "hi", "-n", "4", "--temperature", "0"])
    assert r.exit_code == 0, r.output
    m = llamay.load(tiny)
    text = m.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert "hi" in text and text != "hi"  # the template applied
    assert r.stdout == m.generate(text, max_tokens=4, temperature=0.0) + "\n"


def test_a_model_without_a_template_layer_uses_its_ggufs(env, tiny, monkeypatch) -> None:
    """`create` FROM a GGUF whose Modelfile has no TEMPLATE: the SYSTEM layer still
    counts, through the GGUF's own chat template (Ollama makes a template layer of it)."""
    import llamay.ollama as ollama

    monkeypatch.setenv("OLLAMA_MODELS", str(env.home / "none"))
    store.create("sys:1", f"FROM {tiny}\nSYSTEM Be terse.\nPARAMETER temperature 0", progress=False)
    model, om = library.load("sys:1")
    assert om.template is None and om.system == "Be terse."
    messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"}]
    want = model.generate(
        model.tokenizer.apply_chat_template(messages), max_tokens=4, temperature=0
    )
    assert ollama.generate(model, om, "hi", max_tokens=4) == want
    model.close()
    store.remove("sys:1")
