"""Use the models a local Ollama installation already downloaded, without copying them.

    find_store() -> Path | None           $OLLAMA_MODELS, ~/.ollama/models, /usr/share/ollama/...
    list_models(root=None) -> [OllamaModel]
    resolve(name, root=None) -> OllamaModel   .model_path is the GGUF blob (run it read-only)
    load(name, root=None, ...) -> (llamay Model, OllamaModel)   also llamay's registry pulls
    generate(model, om, prompt, ...)      with the template, system and params layers applied

The `params` layer becomes default sampler settings (`SamplerDefaults`), the `template`
layer formats the prompt (`llamay.ollama.template`, a Go-template subset), the `system`
layer fills `.System`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamay.ollama.errors import OllamaStoreError, UnsupportedTemplateError
from llamay.ollama.params import SamplerDefaults, cut_at_stops
from llamay.ollama.store import (
    FullName,
    OllamaModel,
    candidate_dirs,
    find_store,
    from_manifest,
    list_models,
    resolve,
)
from llamay.ollama.template import render

if TYPE_CHECKING:
    from llamay.api import Model

__all__ = [
    "FullName",
    "OllamaModel",
    "OllamaStoreError",
    "SamplerDefaults",
    "UnsupportedTemplateError",
    "candidate_dirs",
    "cut_at_stops",
    "find_store",
    "format_prompt",
    "from_manifest",
    "generate",
    "list_models",
    "load",
    "resolve",
    "resolve_anywhere",
    "to_modelfile",
]


def load(
    name: str, root: str | os.PathLike[str] | None = None, **load_kwargs: Any
) -> tuple[Model, OllamaModel]:
    """Resolve `name` and load its GGUF blob in place (read-only), with its layers.

    Without `root`, a registry-pulled model in llamay's own store (same layout) is found
    first, then a model of the local Ollama store. The params layer's `num_ctx` sets the
    context size unless `n_ctx` is given.
    """
    import llamay

    om = resolve(name, root) if root is not None else resolve_anywhere(name)
    if om.ignored_layers:
        warnings.warn(
            f"{om.name}: layers llamay does not use yet are ignored: "
            + ", ".join(om.ignored_layers),
            stacklevel=2,
        )
    defaults = om.sampler_defaults()
    if load_kwargs.get("n_ctx") is None and defaults.n_ctx is not None:
        load_kwargs["n_ctx"] = defaults.n_ctx
    return llamay.load(om.model_path, **load_kwargs), om


def resolve_anywhere(name: str) -> OllamaModel:
    """`name` in llamay's store (a registry pull, or a model made by `create`/`cp` that
    carries layers), else in the local Ollama store."""
    from llamay.errors import InvalidModelNameError, ModelNotFoundError
    from llamay.store import list_models as store_models
    from llamay.store import parse_name, store_dir

    ours = store_dir()
    try:
        ref = parse_name(name)
    except InvalidModelNameError:
        ref = None
    if ref is not None:
        for entry in store_models(ours):
            if entry.name == str(ref) and entry.manifest is not None:
                full = FullName(ref.host or "", ref.namespace or "library", ref.name, ref.tag)
                mpath = ours / "manifests" / Path(*ref.parts())
                return from_manifest(ours, full, entry.name, entry.manifest, mpath)
    if (ours / "manifests").is_dir():
        try:
            return resolve(name, ours)
        except ModelNotFoundError:
            pass
    try:
        return resolve(name)
    except ModelNotFoundError as e:
        raise ModelNotFoundError(
            f"{name!r} is not a model with layers in llamay's store {ours} (a registry pull or "
            f"a `llamay create`), and not in an Ollama store: {e}"
        ) from None


def _parameter_text(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)  # quoted, so spaces and '#' survive
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def to_modelfile(om: OllamaModel) -> str:
    """The model as a Modelfile (`ollama show --modelfile`): FROM its blob, then its layers."""

    def block(text: str) -> str:
        return f'"""{text}"""'

    lines = [f"# Modelfile of {om.full_name}", f"FROM {om.model_path}"]
    if om.template is not None:
        lines.append(f"TEMPLATE {block(om.template)}")
    if om.system is not None:
        lines.append(f"SYSTEM {block(om.system)}")
    for key, value in sorted(om.params.items()):
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"PARAMETER {key} {_parameter_text(v)}")
    lines += [f"LICENSE {block(text)}" for text in om.license]
    return "\n".join(lines) + "\n"


def format_prompt(om: OllamaModel, prompt: str, system: str | None = None) -> str:
    """`prompt` through the model's template layer (with its system layer unless `system`).

    Without a template layer, or with one outside the supported subset (a warning says
    so), the prompt is returned unchanged.
    """
    if om.template is None:
        return prompt
    try:
        return render(om.template, prompt, om.system if system is None else system)
    except UnsupportedTemplateError as e:
        warnings.warn(f"{om.name}: {e}; using the prompt as it is", stacklevel=2)
        return prompt


def generate(
    model: Model,
    om: OllamaModel,
    prompt: str,
    *,
    system: str | None = None,
    raw: bool = False,
    stream: bool = False,
    **overrides: Any,
) -> str | Iterator[str]:
    """Generate from an Ollama model: the template formats the prompt (unless `raw`), the
    params layer supplies the sampler defaults (`overrides` win) and its stop strings end
    the text."""
    defaults = om.sampler_defaults()
    kwargs = defaults.generate_kwargs() | overrides
    text = prompt if raw else format_prompt(om, prompt, system)
    pieces = cut_at_stops(model.generate(text, stream=True, **kwargs), defaults.stop)
    return pieces if stream else "".join(pieces)
