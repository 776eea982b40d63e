"""`llamay ocr` end to end on rendered line images."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llamay.ocr.synth import render_line
from llamay_cli.main import app

pytestmark = pytest.mark.model


def test_ocr_command(tmp_path, ppocr_gguf):
    from PIL import Image

    a, b = tmp_path / "a.png", tmp_path / "b.png"
    Image.fromarray(render_line("the quick brown fox", size=32)).save(a)
    Image.fromarray(render_line("over the lazy dog", size=28, noise=10.0)).save(b)
    words = tmp_path / "words.txt"
    words.write_text("the\nquick\nbrown\nfox\nover\nlazy\ndog\n")
    runner = CliRunner()
    res = runner.invoke(app, ["ocr", str(a), "--model", str(ppocr_gguf)])
    assert res.exit_code == 0, res.output
    text, conf = res.stdout.strip().split("\t")
    assert text == "the quick brown fox" and 0.5 < float(conf) <= 1.0
    res = runner.invoke(
        app, ["ocr", str(a), str(b), "--model", str(ppocr_gguf), "--lexicon", str(words), "--json"]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["the quick brown fox", "over the lazy dog"]
    assert [w["text"] for w in rows[1]["words"]] == ["over", "the", "lazy", "dog"]
    assert all(0 <= w["start"] < w["end"] for w in rows[1]["words"])


def test_ocr_command_errors(tmp_path, ppocr_gguf):
    runner = CliRunner()
    res = runner.invoke(app, ["ocr", str(tmp_path / "missing.png"), "--model", str(ppocr_gguf)])
    assert res.exit_code == 1 and "cannot read image" in res.output


def test_ocr_command_with_lm_and_hotword(tmp_path, ppocr_gguf, bugs_bunny_arpa):
    from PIL import Image

    img = tmp_path / "bb.png"
    Image.fromarray(render_line("bugs bunny", size=30, noise=20.0, blur=0.8)).save(img)
    runner = CliRunner()
    for extra in (["--lm", str(bugs_bunny_arpa)], ["--hotword", "bunny"]):
        res = runner.invoke(
            app, ["ocr", str(img), "--model", str(ppocr_gguf), "--beam", "8", *extra]
        )
        assert res.exit_code == 0, res.output
        assert res.stdout.split("\t")[0] == "bugs bunny"
    res = runner.invoke(app, ["ocr", str(img), "--model", str(ppocr_gguf), "--lm", "/no/such.arpa"])
    assert res.exit_code == 1 and "cannot read the ARPA" in res.output
