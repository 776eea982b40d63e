"""An Ollama-layout model's `projector` layer (an mmproj GGUF, as Ollama stores LLaVA-style
vision models) is found by itself: `library.load` attaches it, and the image prompt's first
greedy token is llama.cpp's (tests/fixtures/vision)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
from fixture_data import fixture, tiny_model_file, vision_mmproj
from ollama_layout import OllamaLayout, go_json

from llamay import library, multimodal
from llamay.engine.api import Request
from llamay.sample import Sampler
from llamay.store import manifest as media


def test_projector_layer_is_the_models_mmproj(tmp_path: Path) -> None:
    layout = OllamaLayout(tmp_path / "ollama")
    name = ("registry.ollama.ai", "library", "tinyvision", "latest")
    path = layout.model(name, tiny_model_file("llama"))
    man = json.loads(path.read_bytes())
    mmproj = vision_mmproj("mlp")
    man["layers"].append(layout.blob(mmproj.read_bytes(), media.PROJECTOR))
    path.write_bytes(go_json(man))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "layers llamay does not use" warning
        m, om = library.load("tinyvision", root=tmp_path / "ollama")
    try:
        assert om.projector is not None and om.projector.read_bytes() == mmproj.read_bytes()
        assert om.ignored_layers == ()
        assert m.projector is not None and m.projector.kind == "mlp"
        g = np.load(fixture("vision", "mlp.llamacpp.npz"))
        img = np.load(fixture("vision", "images.npz"))["wide45x29"]
        p = multimodal.layout(m.tokenizer, m.projector, str(g["prompt"]), [img])
        h = m.engine.submit(Request(p.ids, 1, Sampler(temperature=0), images=p.images))
        assert [ev.token_id for ev in h] == [int(g["top_ids_wide45x29"][0])]  # a 0.77 margin
    finally:
        m.close()


def test_llamay_store_model_made_from_it_keeps_the_projector(tmp_path: Path, monkeypatch) -> None:
    """`llamay create` FROM the Ollama model inherits its projector layer, and
    `llamay.load(name)` of the new store model attaches it by itself."""
    import llamay
    from llamay.store.entries import projector_path

    layout = OllamaLayout(tmp_path / "ollama")
    path = layout.model(
        ("registry.ollama.ai", "library", "tinyvis", "latest"), tiny_model_file("llama")
    )
    man = json.loads(path.read_bytes())
    mmproj = vision_mmproj("mlp")
    man["layers"].append(layout.blob(mmproj.read_bytes(), media.PROJECTOR))
    path.write_bytes(go_json(man))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("LLAMAY_HOME", str(tmp_path / "home"))
    library.create("mine:1", "FROM tinyvis\n", progress=False)
    got = projector_path("mine:1")
    assert got is not None and got.read_bytes() == mmproj.read_bytes()
    with llamay.load("mine:1", progress=False) as m:
        assert m.projector is not None and m.projector.kind == "mlp"
