"""Pulling from a real OCI registry (the CNCF distribution registry on loopback): an
Ollama-typed manifest pushed with the OCI protocol, pulled, verified and run."""

from __future__ import annotations

import hashlib
import http.client
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from fixture_data import tiny_model_file
from typer.testing import CliRunner

import llamay.store as store
from llamay import library
from llamay.errors import FetchError, ModelNotFoundError
from llamay.store import manifest as media
from llamay.store import oci
from llamay.store.manifest import Manifest

_ids = itertools.count()


@pytest.fixture(scope="session")
def tiny_gguf() -> Path:
    path = tiny_model_file("llama")
    return path


def _repo() -> str:
    return f"library/tiny{next(_ids)}"


def _sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_verify_and_run(env, registry, tiny_gguf) -> None:
    repo = _repo()
    pushed = registry.push_model(
        repo,
        "latest",
        tiny_gguf,
        template="{{ .Prompt }}",
        params={"temperature": 0.0, "stop": ["<|im_end|>"]},
        license="MIT",
    )
    name = f"{registry.host}/{repo}:latest"
    path = store.pull(name, progress=False)

    # the model blob, every layer and the config, each under its verified digest
    assert path == env.home / "blobs" / f"sha256-{pushed.model().hex}"
    for layer in pushed.blobs():
        blob = env.home / "blobs" / f"sha256-{layer.hex}"
        assert _sha(blob) == layer.digest and blob.stat().st_size == layer.size
    assert path.read_bytes() == tiny_gguf.read_bytes()
    # the manifest: Ollama's layout and bytes
    mpath = env.home / "manifests" / registry.host / "library" / repo.split("/")[1] / "latest"
    assert mpath.read_bytes() == pushed.dumps()
    assert json.loads(mpath.read_bytes())["layers"][0]["mediaType"] == media.MODEL
    # listed, resolvable, a no-op second time (no network: the registry is not asked)
    [entry] = store.list_models()
    assert entry.name == name and entry.path == path and entry.digest == pushed.model().digest
    assert (
        entry.layer_path(media.PARAMS).read_bytes()
        == b'{"temperature": 0.0, "stop": ["<|im_end|>"]}'
    )
    assert store.resolve(name, progress=False) == path
    # runs, and computes exactly what the original file computes
    import llamay

    m = llamay.load(path)
    ids = m.tokenize("Hello world")
    np.testing.assert_array_equal(m.logits(ids), llamay.load(tiny_gguf).logits(ids))


def test_pull_is_a_noop_when_complete(env, registry, tiny_gguf, monkeypatch) -> None:
    repo = _repo()
    registry.push_model(repo, "v1", tiny_gguf)
    name = f"{registry.host}/{repo}:v1"
    store.pull(name, progress=False)

    def boom(*a, **k):
        raise AssertionError("network used")

    monkeypatch.setattr(oci.Registry, "manifest", boom)
    assert store.pull(name, progress=False).is_file()


def test_cli_pull_list_rm(env, registry, tiny_gguf) -> None:
    from llamay_cli.main import app

    repo = _repo()
    registry.push_model(repo, "latest", tiny_gguf, params={"temperature": 0.1})
    name = f"{registry.host}/{repo}:latest"
    runner = CliRunner()
    r = runner.invoke(app, ["pull", name])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith(f"sha256-{_sha(tiny_gguf)[7:]}")
    r = runner.invoke(app, ["list"])
    assert r.exit_code == 0 and name in r.stdout
    r = runner.invoke(app, ["rm", name])
    assert r.exit_code == 0, r.output
    assert store.list_models() == []
    assert [f for f in env.files() if not f.startswith("blobs/.")] == []


def test_unknown_tag_and_repository(env, registry, tiny_gguf) -> None:
    repo = _repo()
    registry.push_model(repo, "latest", tiny_gguf)
    with pytest.raises(ModelNotFoundError, match="not found on the registry"):
        store.pull(f"{registry.host}/{repo}:nope", progress=False)
    with pytest.raises(ModelNotFoundError, match="not found on the registry"):
        store.pull(f"{registry.host}/library/never-pushed:latest", progress=False)
    assert env.files() == []


def test_unreachable_registry(env) -> None:
    from oci_registry import free_port

    with pytest.raises(FetchError, match="cannot reach"):
        store.pull(f"127.0.0.1:{free_port()}/library/x:latest", progress=False)


def test_corrupted_blob_is_refused(env, registry, tiny_gguf) -> None:
    repo = _repo()
    data = bytearray(tiny_gguf.read_bytes())
    data[-100:] = bytes(100)  # a distinct blob just for this test
    pushed = registry.push_model(repo, "latest", bytes(data))
    on_disk = registry.blob_data_path(pushed.model().digest)
    corrupt = bytearray(on_disk.read_bytes())
    corrupt[1000] ^= 0xFF  # same size, one flipped byte
    on_disk.chmod(0o644)
    on_disk.write_bytes(bytes(corrupt))
    with pytest.raises(FetchError, match="checksum mismatch"):
        store.pull(f"{registry.host}/{repo}:latest", progress=False)
    # the config blob may have arrived, verified; nothing else, and no manifest
    model_hex = pushed.model().hex
    assert not any(model_hex in f for f in env.files())
    assert not any(f.startswith("manifests/") for f in env.files())
    assert store.list_models() == []


class _CutResponse:
    """Wraps a blob response; raises like a dropped connection after `limit` bytes."""

    def __init__(self, inner, limit: int):
        self._inner, self._left = inner, limit

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            raise http.client.IncompleteRead(b"", 1)
        data = self._inner.read(min(n, self._left) if n > 0 else self._left)
        self._left -= len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._inner.close()


def _cut_blob_downloads(monkeypatch, digest: str, cuts: list[int | None]) -> list[tuple]:
    """Make the n-th download of `digest` break after cuts[n] bytes; records (offset, start)."""
    seen: list[tuple] = []
    real = oci.Registry.open_blob

    def open_blob(self, repository, dig, offset=0):
        r, start = real(self, repository, dig, offset)
        if dig != digest:
            return r, start
        seen.append((offset, start, r.status if r is not None else None))
        limit = cuts[len(seen) - 1] if len(seen) <= len(cuts) else None
        return (r if limit is None else _CutResponse(r, limit)), start

    monkeypatch.setattr(oci.Registry, "open_blob", open_blob)
    monkeypatch.setattr("llamay.store.blobs.time.sleep", lambda s: None)
    return seen


def test_interrupted_download_resumes_within_one_pull(env, registry, tiny_gguf, monkeypatch):
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    model = pushed.model()
    seen = _cut_blob_downloads(monkeypatch, model.digest, [3 << 20, 1 << 20])
    path = store.pull(f"{registry.host}/{repo}:latest", progress=False)
    assert path.read_bytes() == tiny_gguf.read_bytes()
    # restarted twice, each time with a ranged GET answered by 206 from where it stopped
    assert seen == [(0, 0, 200), (3 << 20, 3 << 20, 206), (4 << 20, 4 << 20, 206)]
    assert not [f for f in env.files() if ".partial" in f]


def test_interrupted_pull_resumes_next_time(env, registry, tiny_gguf, monkeypatch) -> None:
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    model = pushed.model()
    cuts = [2 << 20] + [0] * (store.RESUME_ATTEMPTS - 1)
    seen = _cut_blob_downloads(monkeypatch, model.digest, cuts)
    name = f"{registry.host}/{repo}:latest"
    with pytest.raises(FetchError, match="run the pull again to resume"):
        store.pull(name, progress=False)
    partial = env.home / "blobs" / f".partial-{model.hex}"
    assert partial.stat().st_size == 2 << 20
    assert store.list_models() == []
    assert not (env.home / "blobs" / f"sha256-{model.hex}").exists()
    path = store.pull(name, progress=False)
    assert seen[store.RESUME_ATTEMPTS :] == [(2 << 20, 2 << 20, 206)]
    assert _sha(path) == model.digest and not partial.exists()


def test_resume_when_registry_ignores_range(env, registry, tiny_gguf, monkeypatch) -> None:
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    real = oci.Registry._open

    def no_range(self, method, path, headers):
        return real(self, method, path, {k: v for k, v in headers.items() if k != "Range"})

    monkeypatch.setattr(oci.Registry, "_open", no_range)
    seen = _cut_blob_downloads(monkeypatch, pushed.model().digest, [1 << 20])
    path = store.pull(f"{registry.host}/{repo}:latest", progress=False)
    assert seen == [(0, 0, 200), (1 << 20, 0, 200)]  # from zero, the first MiB skipped
    assert path.read_bytes() == tiny_gguf.read_bytes()


def test_copy_and_remove_keep_shared_blobs(env, registry, tiny_gguf) -> None:
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf, system="You are tiny.")
    name = f"{registry.host}/{repo}:latest"
    store.pull(name, progress=False)
    store.copy(name, f"{registry.host}/{repo}:copy")
    store.copy(name, "mine:1")
    names = [m.name for m in store.list_models()]
    assert names == sorted([name, f"{registry.host}/{repo}:copy", "mine:1"])
    mine = [m for m in store.list_models() if m.name == "mine:1"][0]
    assert mine.layer_path(media.SYSTEM).read_text() == "You are tiny."
    store.remove(name)
    store.remove(f"{registry.host}/{repo}:copy")
    # mine:1 still references every layer
    for layer in pushed.blobs():
        assert (env.home / "blobs" / f"sha256-{layer.hex}").is_file()
    store.remove("mine:1")
    assert env.files() == []


def test_copy_catalogue_model_to_registry_name(env, fake_model) -> None:
    m = fake_model()
    store.pull(m.name, progress=False)
    entry = store.copy(m.name, "example.org/me/fake:1")
    assert entry.path.read_bytes() == m.payload
    man = Manifest.loads((env.home / "manifests/example.org/me/fake/1").read_bytes())
    assert [x.media_type for x in man.layers] == [media.MODEL]
    assert (env.home / "blobs" / f"sha256-{man.config.hex}").is_file()
    store.remove(m.name)
    assert entry.path.is_file()  # still used by the copy
    store.remove("example.org/me/fake:1")
    assert env.files() == []


def test_gc_removes_unreferenced_blobs(env, registry, tiny_gguf) -> None:
    repo = _repo()
    registry.push_model(repo, "latest", tiny_gguf)
    name = f"{registry.host}/{repo}:latest"
    path = store.pull(name, progress=False)
    orphan = env.home / "blobs" / ("sha256-" + "0" * 64)
    orphan.write_bytes(b"x")
    assert store.gc(grace_s=3600) == []  # too young
    assert store.gc(grace_s=0) == [orphan]
    assert path.is_file()


@pytest.mark.model
@pytest.mark.slow
def test_real_smollm2_through_the_registry(env, registry, smollm2_path) -> None:
    """The real 98 MB SmolLM2 blob pushed, pulled, verified and run (greedy, a few tokens)."""
    import llamay

    repo = "library/smollm2"
    pushed = registry.push_model(
        repo, "135m", smollm2_path, params={"temperature": 0.0, "stop": ["<|im_end|>"]}
    )
    assert pushed.model().hex == smollm2_path.name.removeprefix("sha256-")
    path = store.pull(f"{registry.host}/{repo}:135m", progress=False)
    assert _sha(path) == pushed.model().digest
    out = llamay.load(path).generate("The capital of France is", max_tokens=4, temperature=0.0)
    assert "Paris" in out


def test_progress_events_like_ollamas_pull_stream(env, registry, tiny_gguf) -> None:
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf, params={"temperature": 0.3})
    events: list[dict] = []
    store.pull(f"{registry.host}/{repo}:latest", progress=False, events=events.append)
    statuses = [e["status"] for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    for layer in pushed.blobs():
        mine = [e for e in events if e.get("digest") == layer.digest]
        assert mine[0]["status"] == f"pulling {layer.hex[:12]}" and mine[0]["completed"] == 0
        assert mine[-1]["completed"] == mine[-1]["total"] == layer.size
        done = [e["completed"] for e in mine]
        assert done == sorted(done)
    # a second pull is a no-op that still says success
    again: list[dict] = []
    store.pull(f"{registry.host}/{repo}:latest", progress=False, events=again.append)
    # a second pull finds everything present and still streams Ollama's sequence
    assert again[0] == {"status": "pulling manifest"}
    assert again[1:-3] == [
        {
            "status": f"pulling {x.hex[:12]}",
            "digest": x.digest,
            "total": x.size,
            "completed": x.size,
        }
        for x in (*pushed.layers, pushed.config)  # Ollama's order
    ]
    assert [e["status"] for e in again[-3:]] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]


def test_progress_events_for_a_catalogue_pull(env, fake_model) -> None:
    m = fake_model()
    events: list[dict] = []
    store.pull(m.name, progress=False, events=events.append)
    assert events[0] == {"status": "pulling manifest"}
    assert [e["status"] for e in events[-3:]] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    assert events[1]["digest"] == f"sha256:{m.sha256}" and events[1]["completed"] == 0
    assert events[-4]["completed"] == len(m.payload)


def test_registry_layers_take_effect(env, registry, tiny_gguf, monkeypatch) -> None:
    """A pulled model's template/system/params layers, through `llamay.ollama`."""
    import llamay.ollama as ollama

    monkeypatch.setenv("OLLAMA_MODELS", str(env.home.parent / "no-ollama-here"))
    repo = _repo()
    registry.push_model(
        repo,
        "latest",
        tiny_gguf,
        template="{{ if .System }}[{{ .System }}] {{ end }}Q: {{ .Prompt }} A:",
        system="terse",
        params={"temperature": 0.0, "num_predict": 5, "stop": ["\n"]},
    )
    name = f"{registry.host}/{repo}:latest"
    store.pull(name, progress=False)
    model, om = library.load(name)
    assert om.model_path == store.resolve(name, progress=False)
    assert ollama.format_prompt(om, "hi") == "[terse] Q: hi A:"
    assert om.sampler_defaults().generate_kwargs() == {"temperature": 0.0, "max_tokens": 5}
    out = ollama.generate(model, om, "hi")
    ref = model.generate("[terse] Q: hi A:", max_tokens=5, temperature=0.0)
    assert out == ref.split("\n")[0]


def test_lying_size_cannot_delete_a_good_blob(env, registry, tiny_gguf) -> None:
    """A manifest naming a stored blob's digest with another size is refused; the blob and
    the models using it stay intact."""
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    good = store.pull(f"{registry.host}/{repo}:latest", progress=False)
    model = pushed.model()
    liar = Manifest(
        config=pushed.config,
        layers=(media.Layer(media.MODEL, model.digest, model.size - 1),),
    )
    registry.push_manifest(repo, "liar", liar)
    with pytest.raises(FetchError, match="refusing the inconsistent description"):
        store.pull(f"{registry.host}/{repo}:liar", progress=False)
    assert _sha(good) == model.digest
    assert [m.name for m in store.list_models()] == [f"{registry.host}/{repo}:latest"]


def test_gc_refuses_while_a_manifest_is_malformed(env, fake_model) -> None:
    m = fake_model()
    path = store.pull(m.name, progress=False)
    bad = env.home / "manifests" / "broken" / "x.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{")
    with pytest.raises(FetchError, match="not collecting garbage.*broken"):
        store.gc(grace_s=0)
    assert path.is_file()


def test_update_replaces_a_changed_model(env, registry, tiny_gguf) -> None:
    repo = _repo()
    old = registry.push_model(repo, "latest", tiny_gguf, params={"temperature": 0.1})
    name = f"{registry.host}/{repo}:latest"
    store.pull(name, progress=False)
    assert store.pull(name, progress=False, update=True) == env.home / "blobs" / (
        f"sha256-{old.model().hex}"
    )  # unchanged: nothing to do but compare
    new = registry.push_model(repo, "latest", tiny_gguf, params={"temperature": 0.9})
    path = store.pull(name, progress=False, update=True)
    [entry] = store.list_models()
    assert entry.manifest == new and path == entry.path
    old_params = old.layer(media.PARAMS).hex
    assert not (env.home / "blobs" / f"sha256-{old_params}").exists()  # dropped
    assert json.loads(entry.layer_path(media.PARAMS).read_text()) == {"temperature": 0.9}


def test_manifest_without_a_model_layer_is_refused(env, registry) -> None:
    repo = _repo()
    params = registry.push_blob(repo, b'{"temperature":1}', media.PARAMS)
    config = registry.push_blob(repo, b"{}", media.CONFIG)
    registry.push_manifest(repo, "latest", Manifest(config=config, layers=(params,)))
    with pytest.raises(FetchError, match="no model layer"):
        store.pull(f"{registry.host}/{repo}:latest", progress=False)
    assert env.files() == []


def test_unknown_layers_are_kept_and_reported(env, registry, tiny_gguf, monkeypatch) -> None:
    monkeypatch.setenv("OLLAMA_MODELS", str(env.home.parent / "no-ollama-here"))
    repo = _repo()
    pushed = registry.push_model(repo, "latest", tiny_gguf)
    # a layer llamay does not use (a projector was one until vision models: issue 25)
    messages = registry.push_blob(repo, b'[{"role": "user", "content": "hi"}]', media.MESSAGES)
    man = Manifest(config=pushed.config, layers=(*pushed.layers, messages))
    registry.push_manifest(repo, "messages", man)
    name = f"{registry.host}/{repo}:messages"
    store.pull(name, progress=False)
    assert (env.home / "blobs" / f"sha256-{messages.hex}").is_file()
    assert library.layered_model(name).ignored_layers == (media.MESSAGES,)
