"""`create`: a model from a Modelfile, as `ollama create` makes one.

What `FROM` may name decides what a caller can read, so it is explicit:

- a model of this store or the catalogue (its layers are inherited);
- an uploaded blob, `@sha256:<hex>` or `sha256:<hex>` (`/api/blobs/<digest>` over HTTP),
  which must be a GGUF file;
- a GGUF file on this machine, only with `allow_local_files` (the CLI; a server only
  behind `llamay serve --allow-local-files`): resolved (symlinks and `..` followed) and
  checked to start with GGUF's magic before a byte is copied;
- a model of another store (`elsewhere`, which `llamay.library.create` points at the local
  Ollama store), with its template/system/params/license layers.

`ADAPTER` (llama.cpp GGUF LoRA adapters, Ollama's `application/vnd.ollama.image.adapter`
layers, applied at scale 1 when the model loads) names an uploaded blob or, with
`allow_local_files`, a file on this machine; either is checked to be a LoRA adapter of the
base model's architecture before it enters the manifest.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Protocol

from llamay.errors import AdapterError, FetchError, InvalidModelNameError, ModelNotFoundError
from llamay.files import atomic_write_bytes, atomic_write_json, sha256_file
from llamay.store import manifest as media
from llamay.store.blobs import (
    blob_path,
    check_gguf,
    fetch_blob,
    lock,
    manifests_dir,
    put_blob,
    store_dir,
)
from llamay.store.catalog import lookup
from llamay.store.entries import (
    MANIFEST_SCHEMA,
    ModelEntry,
    complete_entry,
    read_entry,
    unknown_message,
)
from llamay.store.manifest import Layer, Manifest
from llamay.store.modelfile import parse as parse_modelfile
from llamay.store.names import ModelRef, manifest_path, parse_name
from llamay.store.pulling import looks_like_path, pull
from llamay.store.source import Source, register_source, status

_BLOB_REF = re.compile(r"@?sha256[:-]([0-9a-f]{64})")


class LayeredModel(Protocol):
    """A model of another store to build on (`llamay.ollama.OllamaModel` is one)."""

    model_path: Path
    template: str | None
    system: str | None
    params: dict[str, Any]
    license: tuple[str, ...]


@register_source
@dataclass(frozen=True)
class FileSource(Source):
    """A local file (what `create` imports from `FROM ./model.gguf`)."""

    kind: ClassVar[str] = "file"
    path: str

    def describe(self) -> str:
        return f"file {self.path}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileSource:
        if not isinstance(data.get("path"), str):
            raise FetchError(f"malformed file source {data!r}")
        return cls(data["path"])

    def fetch(self, sink: Any, *, progress: bool = True) -> None:
        try:
            with open(self.path, "rb") as f:
                while chunk := f.read(1 << 20):
                    sink.write(chunk)
        except OSError as e:
            raise FetchError(f"cannot read {self.path}: {e}") from e


def _import_file(
    root: Path, ref: ModelRef, path: Path, progress: bool, media_type: str = media.MODEL
) -> Layer:
    """Copy a GGUF file into the store's blobs (verified); returns its layer."""
    check_gguf(path, f"{'ADAPTER' if media_type == media.ADAPTER else 'FROM'} {path}")
    try:
        hexdigest, size = sha256_file(path), path.stat().st_size
    except OSError as e:
        raise ModelNotFoundError(f"cannot read the model file {path}: {e}") from e
    with lock(root, f"sha256-{hexdigest}", f"importing {path}", progress=progress):
        fetch_blob(root, ref, hexdigest, size, FileSource(str(path)), progress)
    return Layer(media_type, f"sha256:{hexdigest}", size)


def _check_adapter(path: Path, what: str, model_blob: Path) -> None:
    """`path` is a llama.cpp LoRA adapter for the base model's architecture (its tensors
    are checked against the model's when it loads, `llamay.model.lora`)."""
    from llamay.gguf import GGUFFile  # numpy, only when a model is created

    check_gguf(path, what)
    meta = GGUFFile(path).metadata
    for key, want in (("general.type", "adapter"), ("adapter.type", "lora")):
        if meta.get(key) != want:
            raise AdapterError(f"{what}: {key} is {meta.get(key)!r}, a LoRA adapter has {want!r}")
    arch = GGUFFile(model_blob).metadata.get("general.architecture")
    if meta.get("general.architecture") != arch:
        raise AdapterError(
            f"{what}: general.architecture is {meta.get('general.architecture')!r}, the "
            f"model's (FROM) is {arch!r}"
        )


def _adapter_layer(
    root: Path,
    ref: ModelRef,
    spec: str,
    directory: Path,
    progress: bool,
    allow_local_files: bool,
    model_blob: Path,
) -> Layer:
    """The adapter layer for `ADAPTER spec`: an uploaded blob, or a local file (copied in)
    only with `allow_local_files`."""
    what = f"ADAPTER {spec}"
    m = _BLOB_REF.fullmatch(spec)
    if m is not None:
        path = blob_path(m.group(1), root)
        if not path.is_file():
            raise ModelNotFoundError(
                f"{what}: no such blob in the store (upload it first: POST /api/blobs/"
                f"sha256:{m.group(1)})"
            )
        _check_adapter(path, what, model_blob)
        return Layer(media.ADAPTER, f"sha256:{m.group(1)}", path.stat().st_size)
    if not allow_local_files:
        raise InvalidModelNameError(
            f"{what}: here ADAPTER names an uploaded blob (@sha256:<hex>); local files are "
            "not allowed"
        )
    candidate = Path(spec).expanduser()
    if not candidate.is_absolute():
        candidate = directory / candidate
    try:
        path = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ModelNotFoundError(f"{what}: {candidate} is not a file") from None
    if not path.is_file():
        raise ModelNotFoundError(f"{what}: {candidate} is not a file")
    _check_adapter(path, what, model_blob)
    return _import_file(root, ref, path, progress, media.ADAPTER)


def _local_file(base: str, directory: Path) -> Path | None:
    """The GGUF file `FROM base` names on this machine (resolved), None if it names none."""
    candidate = Path(base).expanduser()
    if not candidate.is_absolute():
        candidate = directory / candidate
    with contextlib.suppress(OSError, ValueError):
        if candidate.is_file():
            return candidate.resolve()
    if looks_like_path(base):
        raise ModelNotFoundError(f"FROM {base}: {candidate} is not a file")
    return None


def _uploaded_blob(root: Path, base: str) -> Layer | None:
    m = _BLOB_REF.fullmatch(base)
    if m is None:
        return None
    path = blob_path(m.group(1), root)
    if not path.is_file():
        raise ModelNotFoundError(
            f"FROM {base}: no such blob in the store (upload it first: POST /api/blobs/"
            f"sha256:{m.group(1)})"
        )
    check_gguf(path, f"FROM {base}")
    return Layer(media.MODEL, f"sha256:{m.group(1)}", path.stat().st_size)


def _base_layers(
    root: Path,
    ref: ModelRef,
    base: str,
    directory: Path,
    progress: bool,
    allow_local_files: bool,
    elsewhere: Callable[[str], LayeredModel | None] | None,
) -> tuple[Layer, tuple[Layer, ...]]:
    """The model layer and inherited layers for `FROM base` (see the module docstring)."""
    uploaded = _uploaded_blob(root, base)
    if uploaded is not None:
        return uploaded, ()
    if allow_local_files:
        path = _local_file(base, directory)
        if path is not None:
            return _import_file(root, ref, path, progress), ()
    elif looks_like_path(base):
        raise InvalidModelNameError(
            f"FROM {base}: a file path; here FROM names a model or an uploaded blob "
            "(@sha256:<hex>), and local files are not allowed"
        )
    try:
        base_ref: ModelRef | None = parse_name(base)
    except InvalidModelNameError:
        base_ref = None  # perhaps an Ollama name (they allow upper case)
    if base_ref is not None:
        entry = complete_entry(root, base_ref)
        if entry is None and lookup(base_ref) is not None:
            pull(base, progress=progress)
            entry = complete_entry(root, base_ref)
        if entry is not None:
            model = Layer(media.MODEL, entry.digest, entry.size)
            layers = entry.manifest.layers if entry.manifest is not None else ()
            return model, tuple(x for x in layers if x.media_type != media.MODEL)
    other = elsewhere(base) if elsewhere is not None else None
    if other is None:
        if base_ref is None:
            parse_name(base)  # raises the name error
        raise ModelNotFoundError(unknown_message(base_ref, root))  # type: ignore[arg-type]
    inherited = [
        put_blob(root, text.encode(), mt)
        for text, mt in ((other.template, media.TEMPLATE), (other.system, media.SYSTEM))
        if text is not None
    ]
    if other.params:
        params = json.dumps(other.params, separators=(",", ":"), sort_keys=True) + "\n"
        inherited.append(put_blob(root, params.encode(), media.PARAMS))
    inherited += [put_blob(root, text.encode(), media.LICENSE) for text in other.license]
    if getattr(other, "projector", None) is not None:  # a vision model's mmproj GGUF
        inherited.append(_import_file(root, ref, other.projector, progress, media.PROJECTOR))
    return _import_file(root, ref, other.model_path, progress), tuple(inherited)


def create(
    name: str,
    modelfile: str,
    directory: str | os.PathLike[str] | None = None,
    progress: bool = True,
    *,
    allow_local_files: bool = True,
    elsewhere: Callable[[str], LayeredModel | None] | None = None,
) -> ModelEntry:
    """Create `name` from a Modelfile's text (`llamay.store.modelfile`), like `ollama create`.

    `FROM` names a model of this store or the catalogue, an uploaded blob, a GGUF path
    (relative to `directory`, default the current directory; copied into the store; only
    with `allow_local_files`), or a model `elsewhere` finds; its template/system/params/
    license layers are inherited, and the Modelfile's own replace them (parameters merge,
    the Modelfile's winning). A registry name gets an Ollama manifest; another name a llamay
    manifest carrying the layers. Raises `ModelfileError`, `ModelNotFoundError`,
    `InvalidModelNameError`, `GGUFMagicError` (FROM is not a GGUF file) or `FetchError`.
    """
    mf = parse_modelfile(modelfile)
    ref = parse_name(name)
    root = store_dir()
    base_dir = Path(directory) if directory is not None else Path.cwd()
    model, inherited = _base_layers(
        root, ref, mf.base, base_dir, progress, allow_local_files, elsewhere
    )
    by_type = {
        x.media_type: x for x in inherited if x.media_type not in (media.LICENSE, media.ADAPTER)
    }
    licenses = [x for x in inherited if x.media_type == media.LICENSE]
    adapters = [x for x in inherited if x.media_type == media.ADAPTER]
    adapters += [
        _adapter_layer(
            root, ref, a, base_dir, progress, allow_local_files, blob_path(model.digest, root)
        )
        for a in mf.adapters
    ]
    if mf.template is not None:
        by_type[media.TEMPLATE] = put_blob(root, mf.template.encode(), media.TEMPLATE)
    if mf.system is not None:
        by_type[media.SYSTEM] = put_blob(root, mf.system.encode(), media.SYSTEM)
    if mf.params:
        params = {}
        old = by_type.get(media.PARAMS)
        if old is not None:
            with contextlib.suppress(OSError, ValueError):
                params = json.loads(blob_path(old.digest, root).read_bytes())
        params.update(mf.params)
        mf.params = params
        by_type[media.PARAMS] = put_blob(root, mf.params_json(), media.PARAMS)
    licenses += [put_blob(root, text.encode(), media.LICENSE) for text in mf.licenses]
    order = (media.PROJECTOR, media.TEMPLATE, media.SYSTEM, media.PARAMS)  # projector: mmproj
    layers = (model, *adapters, *(by_type[t] for t in order if t in by_type), *licenses)
    cfg = put_blob(root, _config(blob_path(model.digest, root)), media.CONFIG)
    man = Manifest(config=cfg, layers=layers)
    dpath = manifest_path(manifests_dir(root), ref)
    if ref.host:
        atomic_write_bytes(dpath, man.dumps())
    else:
        atomic_write_json(
            dpath,
            {
                "schema_version": MANIFEST_SCHEMA,
                "name": ref.repository,
                "tag": ref.tag,
                "digest": model.digest,
                "size": model.size,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "manifest": man.to_json(),
            },
        )
    status(f"created {ref}", progress=progress)
    entry = read_entry(root, ref)
    assert entry is not None
    return entry


def _config(model_blob: Path) -> bytes:
    """The config blob Ollama writes for a GGUF model (its family read from the file)."""
    arch = None
    with contextlib.suppress(Exception):
        from llamay.gguf import GGUFFile  # numpy, only when a model is created

        arch = GGUFFile(model_blob).metadata.get("general.architecture")
    config = {
        "model_format": "gguf",
        "model_family": arch or "",
        "model_families": [arch] if arch else None,
        "model_type": "",
        "file_type": "",
        "architecture": "amd64",
        "os": "linux",
    }
    return json.dumps(config, separators=(",", ":")).encode() + b"\n"
