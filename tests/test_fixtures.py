"""The suite's own data: each tiny model rebuilds to the recorded bytes of the original, the
recipe agrees with its makers' manifest, missing data skips here and fails in CI, the run's
skip line counts by reason, and no test reads `../shared` beside the repository."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import fixture_data
import pytest
from fixture_data import TINY_GOLDENS, generator, missing, tiny_model_file, tiny_names, tiny_recipe
from skip_counts import add_up, format_skips

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST = json.loads((TINY_GOLDENS / "manifest.json").read_text())  # by the models' makers


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return generator().read_tokenizer(smollm2_path)


def test_every_tiny_model_rebuilds_to_its_recorded_sha256(tokenizer, tmp_path):
    """From scratch (not the cache): the recipe, the seeds and SmolLM2's tokenizer give the
    original files byte for byte, the size the makers' manifest records too."""
    gen, recipe = generator(), tiny_recipe()
    assert sorted(MANIFEST) == tiny_names()
    for name in tiny_names():
        path = gen.build(name, recipe, tokenizer, tmp_path / f"{name}.gguf", check=False)
        assert gen.sha256(path) == recipe["models"][name]["sha256"], name
        assert path.stat().st_size == MANIFEST[name]["size_bytes"], name


def test_the_cached_models_are_the_recorded_ones():
    for name in tiny_names():
        path = tiny_model_file(name)
        assert generator().sha256(path) == tiny_recipe()["models"][name]["sha256"], name


def test_the_recipe_is_the_manifests_tensors():
    """Name, ggml shape, type, mean and std of every tensor, in file order, as the makers
    recorded them (phi3's fused qkv: q/k rows at gain 1.2, v rows at 1)."""
    for name, made in MANIFEST.items():
        recipe = tiny_recipe()["models"][name]["tensors"]
        assert [t["name"] for t in recipe] == [t["name"] for t in made["tensors"]]
        for ours, theirs in zip(recipe, made["tensors"], strict=True):
            assert (ours["ne"], ours["type"], ours["mean"]) == (
                theirs["ne"], theirs["type"], theirs["mean"]
            )  # fmt: skip
            std = ours["std"]
            if isinstance(std, list):
                assert sum(rows for rows, _ in std) == ours["ne"][1]
                std = sorted({s for _, s in std})
            assert std == theirs["std"], ours["name"]


def test_a_changed_recipe_is_refused(tokenizer, tmp_path):
    gen = generator()
    recipe = json.loads(json.dumps(tiny_recipe()))
    recipe["models"]["llama"]["tensors"][1]["std"] = 0.2  # output_norm, drawn otherwise
    with pytest.raises(gen.RecipeMismatch, match="llama.gguf has sha256"):
        gen.build("llama", recipe, tokenizer, tmp_path / "llama.gguf")
    assert not list(tmp_path.iterdir())  # nothing half-made left behind


def test_missing_data_skips_here_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(fixture_data, "_required", False)
    with pytest.raises(pytest.skip.Exception, match="golden.json is absent"):
        missing("golden.json is absent")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required test data is missing: golden"):
        missing("golden.json is absent")
    monkeypatch.delenv("CI")
    monkeypatch.setattr(fixture_data, "_required", True)  # pytest --require-fixtures
    with pytest.raises(pytest.fail.Exception):
        missing("golden.json is absent")


def test_skip_counts_add_up_across_files():
    lines = [json.dumps({"needs a GPU": 2}), "", json.dumps({"needs a GPU": 1, "no pwsh": 1})]
    assert format_skips(add_up(lines)) == "skips by reason (4): 3 x needs a GPU; 1 x no pwsh"
    assert format_skips(collections.Counter()) == "skips by reason: none"


def _lines_matching(pattern: re.Pattern, rooms: tuple[str, ...]) -> list[str]:
    found = []
    for room in rooms:
        for path in (REPO_ROOT / room).rglob("*"):
            if path.suffix in (".py", ".sh") and path != Path(__file__):
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line):
                        found.append(f"{path.relative_to(REPO_ROOT)}:{n}")
    return found


def test_nothing_reads_the_shared_directory_beside_the_repository():
    pattern = re.compile(r"""\.\./shared|["']shared["']\s*/\s*["']fixtures|/shared/fixtures""")
    offenders = _lines_matching(pattern, ("tests", "bench", "scripts", "llamay", "cli"))
    assert not offenders, offenders


def test_absent_data_goes_through_missing():
    """A test that skips by itself for an absent file, an unfetchable model or an
    uninstalled oracle package would skip in CI too: such data goes through
    fixture_data (`missing`, `fixture`, `oracle`), which fails there."""
    pattern = re.compile(r"importorskip\(|pytest\.skip\(.*(absent|cannot be fetched|not available)")
    offenders = _lines_matching(pattern, ("tests",))
    assert not offenders, offenders
