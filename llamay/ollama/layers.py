"""Using an Ollama model's layers: the prompt through its template, generation with its
params and stop strings, the model written back as a Modelfile."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from llamay.ollama.errors import UnsupportedTemplateError
from llamay.ollama.params import cut_at_stops
from llamay.ollama.store import OllamaModel
from llamay.ollama.template import render

if TYPE_CHECKING:  # a type only: the Ollama room never imports the JAX side
    from llamay.api import Model


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
    lines += [f"ADAPTER {p}" for p in om.adapters]  # as `ollama show --modelfile`
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


def gguf_chat_prompt(model: Model, prompt: str, system: str | None = None) -> str:
    """`prompt` (and `system`) through the GGUF's own chat template, as Ollama formats a
    model whose GGUF came without a template layer (it makes one from the GGUF's); the
    prompt unchanged when the GGUF has none."""
    if not model.tokenizer.chat_template:
        return prompt
    head = [{"role": "system", "content": system}] if system else []
    return model.tokenizer.apply_chat_template([*head, {"role": "user", "content": prompt}])


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
    """Generate from an Ollama model: the template formats the prompt (unless `raw`; the
    GGUF's own chat template when there is no template layer, as for a model `create`d
    FROM another without one), the params layer supplies the sampler defaults
    (`overrides` win) and its stop strings end the text."""
    defaults = om.sampler_defaults()
    kwargs = defaults.generate_kwargs() | overrides
    if raw:
        text = prompt
    elif om.template is None:
        text = gguf_chat_prompt(model, prompt, om.system if system is None else system)
    else:
        text = format_prompt(om, prompt, system)
    pieces = cut_at_stops(model.generate(text, stream=True, **kwargs), defaults.stop)
    return pieces if stream else "".join(pieces)
