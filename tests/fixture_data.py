"""Where the tests' oracle data lives, and what a missing piece does.

- `FIXTURES` (`tests/fixtures/`): the committed goldens; each folder's README says where its
  figures came from.
- `tiny_model_file(name)`: one of the tiny random models, rebuilt byte for byte on first use by
  `tests/fixtures/tiny/generate.py` into `$LLAMAY_CACHE/fixtures/tiny/` (default
  `~/.cache/llamay/fixtures/tiny/`) from its recipe plus SmolLM2's tokenizer (the store's
  `smollm2:135m`, fetched on first use), and checked against its recorded sha256.
- `missing(reason)`: a fixture, model or test-oracle package (`oracle(module)`) that is not
  there skips the test on a developer's machine and fails it where the fixtures are
  required: `CI=true`, or `pytest --require-fixtures` (which `make test` passes). Only what
  needs other hardware or tools (a GPU, pwsh, ...) may skip there.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_GOLDENS = FIXTURES / "tiny"
_required = False


def require_fixtures(flag: bool) -> None:
    """Set by tests/conftest.py from `--require-fixtures`."""
    global _required
    _required = flag


def fixtures_required() -> bool:
    return _required or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str):
    """Skip (a developer's machine) or fail (CI, `--require-fixtures`) for absent test data;
    also at a module's top level."""
    if fixtures_required():
        pytest.fail(f"required test data is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def oracle(module: str):
    """Import a test-only oracle package (jsonschema, onnxruntime, lm_eval, ...), or
    `missing` when it is not installed (a CI without it checks less than it says)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"the test oracle package {module} is not installed: {e}")


def fixture(*parts: str) -> Path:
    """A committed fixture under tests/fixtures, or `missing` when it is not there."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        missing(f"{path} is absent")
    return path


def fixture_module(*parts: str):
    """A generator script under tests/fixtures/ (`fixture_module("lora", "make_lora.py")`)
    as a module, loaded once per process."""
    path = FIXTURES.joinpath(*parts)
    name = "fixture_" + "_".join(parts).removesuffix(".py").replace("-", "_").replace("/", "_")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def generator():
    """tests/fixtures/tiny/generate.py as a module."""
    return fixture_module("tiny", "generate.py")


@functools.cache
def tiny_recipe() -> dict:
    return generator().load_recipe()


def tiny_names() -> list[str]:
    """Every tiny model, sorted (for parametrising)."""
    return sorted(tiny_recipe()["models"])


def _cached_fixtures() -> Path:
    root = os.environ.get("LLAMAY_CACHE")
    root = Path(root).expanduser() if root else Path.home() / ".cache" / "llamay"
    return root / "fixtures"


def tiny_cache_dir() -> Path:
    return _cached_fixtures() / "tiny"


@functools.cache
def _verified(path: Path, digest: str) -> bool:
    return path.is_file() and generator().sha256(path) == digest


def tiny_model_file(name: str) -> Path:
    """The tiny model `name` (`llama`, `qwen3moe`, ...), rebuilt into the cache if absent."""
    models = tiny_recipe()["models"]
    if name not in models:
        raise KeyError(f"no tiny model {name!r} in {TINY_GOLDENS / 'recipe.json'}")
    path = tiny_cache_dir() / models[name]["file"]
    if not _verified(path, models[name]["sha256"]):
        _rebuild_all()
    return path


def _rebuild_all() -> None:
    """Rebuild every tiny model that is absent or altered (they share one tokenizer read)."""
    oracle("gguf")  # gguf-py writes and quantises them, as it wrote the originals
    gen = generator()
    recipe = tiny_recipe()
    todo = [
        n
        for n, m in recipe["models"].items()
        if not _verified(tiny_cache_dir() / m["file"], m["sha256"])
    ]
    tokenizer = gen.read_tokenizer(_tokenizer_source())
    tiny_cache_dir().mkdir(parents=True, exist_ok=True)
    for name in todo:
        gen.build(name, recipe, tokenizer, tiny_cache_dir() / recipe["models"][name]["file"])
    _verified.cache_clear()


def _tokenizer_source() -> Path:
    from llamay.errors import FetchError
    from llamay.store import resolve

    source = tiny_recipe()["tokenizer_source"]
    try:
        return resolve(source["model"])
    except FetchError as e:
        missing(f"the tiny models need {source['model']}'s tokenizer, which cannot be fetched: {e}")


def vision_mmproj(name: str) -> Path:
    """The tiny mmproj file `name` (gemma3, idefics3, mlp, gemma3-f16, mlp-f16), rebuilt
    into `$LLAMAY_CACHE/fixtures/vision/` by tests/fixtures/vision/make_models.py when
    absent or altered (checked against its recorded sha256, as the tiny models are)."""
    digests = json.loads((FIXTURES / "vision" / "mmproj.sha256.json").read_text())
    if name not in digests:
        raise KeyError(f"no tiny mmproj {name!r} in tests/fixtures/vision/mmproj.sha256.json")
    path = _cached_fixtures() / "vision" / f"{name}.mmproj.gguf"
    if not _verified(path, digests[name]):
        oracle("gguf")  # gguf-py writes them, as it wrote the originals
        module = fixture_module("vision", "make_models.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        kind = name.removesuffix("-f16")
        module.write(kind, partial, f16=name.endswith("-f16"))
        os.replace(partial, path)
        _verified.cache_clear()
        if not _verified(path, digests[name]):
            raise AssertionError(f"{path}: rebuilt, but not the recorded bytes (sha256)")
    return path
