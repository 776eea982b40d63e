"""Models across llamay's store and a local Ollama store: what a name means to
`llamay generate`, `llamay show`, `llamay run` and `llamay create`.

Above both stores: `llamay.store` never imports `llamay.ollama`, and `llamay.ollama` reads
only Ollama's store; what spans the two is here.

    resolve(name_or_path, progress=True) -> Path   a path, llamay's store (pulled if needed),
                                           else the Ollama store's blob (read in place)
    layered_model(name) -> OllamaModel     a model with its layers: llamay's store (a
                                           registry pull, `create`, `cp`), else Ollama's
    load(name, **load_kwargs) -> (Model, OllamaModel)   loaded in place, with its layers
    create(name, modelfile, ...)           `llamay.store.create`, FROM an Ollama model too
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamay import ollama
from llamay import store as llamay_store
from llamay.errors import InvalidModelNameError, ModelNotFoundError

if TYPE_CHECKING:  # a type only (the JAX side is imported by `load` alone)
    from llamay.api import Model


def resolve(name_or_path: str | os.PathLike[str], progress: bool = True) -> Path:
    """A model file: `llamay.store.resolve`, with names neither in llamay's store nor in its
    catalogue looked up in the local Ollama store before a registry pull."""
    return llamay_store.resolve(name_or_path, progress, elsewhere=ollama.find_blob)


def layered_model(name: str) -> ollama.OllamaModel:
    """`name` in llamay's store (a registry pull, or a model made by `create`/`cp` that
    carries layers), else in the local Ollama store."""
    ours = llamay_store.store_dir()
    try:
        ref = llamay_store.parse_name(name)
    except InvalidModelNameError:
        ref = None
    if ref is not None:
        for entry in llamay_store.list_models(ours):
            if entry.name == str(ref) and entry.manifest is not None:
                full = ollama.FullName(
                    ref.host or "", ref.namespace or "library", ref.name, ref.tag
                )
                mpath = ours / "manifests" / Path(*ref.parts())
                return ollama.from_manifest(ours, full, entry.name, entry.manifest, mpath)
    if (ours / "manifests").is_dir():
        try:
            return ollama.resolve(name, ours)
        except ModelNotFoundError:
            pass
    try:
        return ollama.resolve(name)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(
            f"{name!r} is not a model with layers in llamay's store {ours} (a registry pull or "
            f"a `llamay create`), and not in an Ollama store: {e}"
        ) from None


def load(
    name: str, root: str | os.PathLike[str] | None = None, **load_kwargs: Any
) -> tuple[Model, ollama.OllamaModel]:
    """Resolve `name` (in the Ollama store `root`, if given) and load its GGUF blob in place
    (read-only), with its layers. The params layer's `num_ctx` sets the context size unless
    `n_ctx` is given; a `projector` layer is its vision projector (`mmproj=`)."""
    import llamay  # JAX: imported only to load, so resolving stays light

    om = ollama.resolve(name, root) if root is not None else layered_model(name)
    if om.ignored_layers:
        warnings.warn(
            f"{om.name}: layers llamay does not use yet are ignored: "
            + ", ".join(om.ignored_layers),
            stacklevel=2,
        )
    defaults = om.sampler_defaults()
    if load_kwargs.get("n_ctx") is None and defaults.n_ctx is not None:
        load_kwargs["n_ctx"] = defaults.n_ctx
    # its ADAPTER layers at scale 1 (Ollama's), before any the caller adds
    lora = [*((p, 1.0) for p in om.adapters), *load_kwargs.pop("lora", ())]
    if load_kwargs.get("mmproj") is None and om.projector is not None:
        load_kwargs["mmproj"] = om.projector  # its vision projector layer (an mmproj GGUF)
    return llamay.load(om.model_path, lora=lora, **load_kwargs), om


def create(
    name: str,
    modelfile: str,
    directory: str | os.PathLike[str] | None = None,
    progress: bool = True,
    *,
    allow_local_files: bool = True,
) -> llamay_store.ModelEntry:
    """`llamay.store.create`, where FROM may also name a model of the local Ollama store
    (its blob is copied in, its layers inherited)."""
    return llamay_store.create(
        name,
        modelfile,
        directory,
        progress,
        allow_local_files=allow_local_files,
        elsewhere=ollama.find_model,
    )
