"""Reading a local Ollama store, read-only: find it, list its models, resolve a name.

An Ollama store (`$OLLAMA_MODELS`, else `~/.ollama/models`, else the system service's
`/usr/share/ollama/.ollama/models`) has the same shape as llamay's registry part:

    blobs/sha256-<hex>                       (very old versions: `sha256:<hex>`)
    manifests/<host>/<namespace>/<model>/<tag>

Each manifest is an Ollama-typed schema-2 manifest (`llamay.store.manifest`). Nothing here
writes to the store; a model runs straight from its blob.

Names are matched the way `ollama` shows them: `model:tag` for the `library` namespace of
a host, `namespace/model:tag`, or the full `host/namespace/model:tag`; the tag defaults
to `latest`, and the comparison ignores case. A short name that matches models on two
hosts is ambiguous and is refused with the full names. Names are only ever *matched*
against the manifests found on disk, so no name can lead outside the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamay.errors import LlamayError, ModelNotFoundError
from llamay.ollama.errors import OllamaStoreError
from llamay.ollama.params import SamplerDefaults
from llamay.store import manifest as media
from llamay.store.manifest import Manifest

DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
_HEX = re.compile(r"sha256:([0-9a-f]{64})")


def candidate_dirs() -> list[Path]:
    """Where an Ollama store may be, in the order Ollama itself looks."""
    out = []
    env = os.environ.get("OLLAMA_MODELS")
    if env:
        out.append(Path(env).expanduser())
    out.append(Path.home() / ".ollama" / "models")
    out.append(Path("/usr/share/ollama/.ollama/models"))
    return out


def find_store(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The first directory with a `manifests/` folder: `explicit`, `$OLLAMA_MODELS`,
    `~/.ollama/models`, `/usr/share/ollama/.ollama/models`; None if there is none."""
    dirs = [Path(explicit).expanduser()] if explicit is not None else candidate_dirs()
    for d in dirs:
        with contextlib.suppress(OSError):
            if (d / "manifests").is_dir():
                return d
    return None


@dataclass(frozen=True)
class FullName:
    host: str
    namespace: str
    model: str
    tag: str

    def __str__(self) -> str:
        host = f"{self.host}/" if self.host else ""  # no host: a local llamay name
        return f"{host}{self.namespace}/{self.model}:{self.tag}"

    def key(self) -> tuple[str, str, str, str]:
        return (self.host.lower(), self.namespace.lower(), self.model.lower(), self.tag.lower())


@dataclass(frozen=True)
class OllamaModel:
    """One model of an Ollama store, with its layers read."""

    name: str  # as `ollama list` shows it (shortest unambiguous form)
    full_name: FullName
    manifest: Manifest
    manifest_path: Path
    model_path: Path  # the GGUF blob
    modified: datetime
    template: str | None = None
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    license: tuple[str, ...] = ()
    #: Layers llamay does not use (projectors, ...): their media types.
    ignored_layers: tuple[str, ...] = ()
    #: Its LoRA adapter blobs (`ADAPTER` layers), applied at scale 1 as Ollama does.
    adapters: tuple[Path, ...] = ()
    #: Its vision projector blob (a `projector` layer: an mmproj GGUF), or None.
    projector: Path | None = None

    @property
    def digest(self) -> str:
        return self.manifest.model().digest

    @property
    def size(self) -> int:
        """All blobs together, as `ollama list` reports it."""
        return self.manifest.total_size

    def sampler_defaults(self) -> SamplerDefaults:
        """The `params` layer as default sampler settings (see `llamay.ollama.params`)."""
        return SamplerDefaults.from_params(self.params, source=str(self.full_name))


def _blob(root: Path, digest: str) -> Path:
    m = _HEX.fullmatch(digest)
    if not m:
        raise OllamaStoreError(f"malformed digest {digest!r} in the Ollama store {root}")
    for name in (f"sha256-{m.group(1)}", f"sha256:{m.group(1)}"):
        p = root / "blobs" / name
        if p.is_file():
            return p
    raise OllamaStoreError(
        f"blob {digest} is missing from the Ollama store {root} (an interrupted `ollama pull`?"
        " run it again)"
    )


def _manifests(root: Path) -> list[tuple[FullName, Path]]:
    base = root / "manifests"
    out = []
    for host in sorted(_dirs(base)):
        for ns in sorted(_dirs(host)):
            for model in sorted(_dirs(ns)):
                with contextlib.suppress(OSError):
                    for tag in sorted(model.iterdir()):
                        if tag.is_file() and not tag.name.startswith("."):
                            out.append((FullName(host.name, ns.name, model.name, tag.name), tag))
    return out


def _dirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []


def _short_names(names: list[FullName]) -> dict[FullName, str]:
    """The shortest form of each name that no other name in the store shares."""
    forms: dict[FullName, list[str]] = {}
    count: dict[str, int] = {}
    for n in names:
        cands = []
        if n.namespace.lower() == DEFAULT_NAMESPACE:
            cands.append(f"{n.model}:{n.tag}")
        cands.append(f"{n.namespace}/{n.model}:{n.tag}")
        forms[n] = cands
        for c in cands:
            count[c.lower()] = count.get(c.lower(), 0) + 1
    return {
        n: next((c for c in cands if count[c.lower()] == 1), str(n)) for n, cands in forms.items()
    }


def _read_text(root: Path, manifest: Manifest, media_type: str) -> str | None:
    layer = manifest.layer(media_type)
    return None if layer is None else _blob(root, layer.digest).read_text("utf-8")


def _load(root: Path, name: FullName, short: str, path: Path) -> OllamaModel:
    try:
        man = Manifest.loads(path.read_bytes(), str(path))
    except (OSError, ValueError) as e:
        raise OllamaStoreError(f"cannot read the Ollama manifest {path}: {e}") from e
    return from_manifest(root, name, short, man, path)


def from_manifest(root: Path, name: FullName, short: str, man: Manifest, path: Path) -> OllamaModel:
    """An `OllamaModel` from a manifest whose blobs are in `root/blobs` (also llamay's store:
    the same layout)."""
    try:
        model_layer = man.model()
    except LlamayError as e:
        raise OllamaStoreError(f"{name}: {e}") from e
    template = _read_text(root, man, media.TEMPLATE) or _read_text(root, man, media.PROMPT)
    params: dict[str, Any] = {}
    raw = _read_text(root, man, media.PARAMS)
    if raw is not None:
        try:
            params = json.loads(raw)
        except json.JSONDecodeError as e:
            raise OllamaStoreError(f"{name}: the params layer is not JSON: {e}") from e
        if not isinstance(params, dict):
            raise OllamaStoreError(f"{name}: the params layer is not a JSON object")
    licenses = tuple(
        _blob(root, x.digest).read_text("utf-8")
        for x in man.layers
        if x.media_type == media.LICENSE
    )
    used = {media.MODEL, media.TEMPLATE, media.PROMPT, media.SYSTEM, media.PARAMS, media.LICENSE}
    used.add(media.ADAPTER)
    used.add(media.PROJECTOR)
    projectors = [x for x in man.layers if x.media_type == media.PROJECTOR]
    return OllamaModel(
        name=short,
        full_name=name,
        manifest=man,
        manifest_path=path,
        model_path=_blob(root, model_layer.digest),
        modified=datetime.fromtimestamp(path.stat().st_mtime, UTC),
        template=template,
        system=_read_text(root, man, media.SYSTEM),
        params=params,
        license=licenses,
        ignored_layers=tuple(x.media_type for x in man.layers if x.media_type not in used),
        adapters=tuple(_blob(root, x.digest) for x in man.layers if x.media_type == media.ADAPTER),
        projector=_blob(root, projectors[0].digest) if projectors else None,
    )


def list_models(root: str | os.PathLike[str] | None = None) -> list[OllamaModel]:
    """Every readable model of the Ollama store (`find_store()` when `root` is None), sorted
    by name; an unreadable one is skipped with a warning naming it."""
    base = find_store(root) if root is not None else find_store()
    if base is None:
        return []
    found = _manifests(base)
    short = _short_names([n for n, _ in found])
    out = []
    for name, path in found:
        try:
            out.append(_load(base, name, short[name], path))
        except OllamaStoreError as e:
            warnings.warn(f"skipping Ollama model {name}: {e}", stacklevel=2)
    return sorted(out, key=lambda m: m.name)


def _matches(text: str, n: FullName) -> bool:
    repo, sep, tag = text.rpartition(":") if ":" in text.rsplit("/", 1)[-1] else (text, "", "")
    tag = tag if sep else DEFAULT_TAG
    parts = repo.split("/")
    if len(parts) == 1:
        want = (DEFAULT_NAMESPACE, parts[0], tag)
        return (n.namespace.lower(), n.model.lower(), n.tag.lower()) == tuple(
            w.lower() for w in want
        )
    if len(parts) == 2:
        return (n.namespace.lower(), n.model.lower(), n.tag.lower()) == (
            parts[0].lower(),
            parts[1].lower(),
            tag.lower(),
        )
    if len(parts) == 3:
        return n.key() == (parts[0].lower(), parts[1].lower(), parts[2].lower(), tag.lower())
    return False


def resolve(name: str, root: str | os.PathLike[str] | None = None) -> OllamaModel:
    """The Ollama model called `name` (see the module docstring for the forms).

    Raises `ModelNotFoundError` (no store, no such model, or an ambiguous short name) or
    `OllamaStoreError` (the model's manifest or a blob is unreadable).
    """
    base = find_store(root) if root is not None else find_store()
    if base is None:
        where = ", ".join(str(d) for d in candidate_dirs())
        raise ModelNotFoundError(f"no Ollama store found (looked in {where}; set OLLAMA_MODELS)")
    found = _manifests(base)
    hits = [(n, p) for n, p in found if _matches(name, n)]
    if not hits:
        short = _short_names([n for n, _ in found])
        known = ", ".join(sorted(short.values())) or "(none)"
        raise ModelNotFoundError(f"no model {name!r} in the Ollama store {base}; it has: {known}")
    if len(hits) > 1:
        raise ModelNotFoundError(
            f"{name!r} is ambiguous in the Ollama store {base}: "
            + ", ".join(str(n) for n, _ in hits)
        )
    short = _short_names([n for n, _ in found])
    (n, p) = hits[0]
    return _load(base, n, short[n], p)


def find_blob(name: str) -> Path | None:
    """The model blob of `name` in the local Ollama store; None when there is no store or
    it has no (readable) model of that name."""
    if find_store() is None:
        return None
    try:
        return resolve(name).model_path
    except LlamayError:
        return None


def find_model(name: str) -> OllamaModel | None:
    """The Ollama model `name` with its layers, or None when there is no Ollama store.
    Raises `ModelNotFoundError`/`OllamaStoreError` when the store lacks or garbles it."""
    if find_store() is None:
        return None
    return resolve(name)
