"""Use the models a local Ollama installation already downloaded, without copying them.

    find_store() -> Path | None           $OLLAMA_MODELS, ~/.ollama/models, /usr/share/ollama/...
    list_models(root=None) -> [OllamaModel]
    resolve(name, root=None) -> OllamaModel   .model_path is the GGUF blob (run it read-only)
    find_blob(name) / find_model(name)    the same, None when there is no Ollama store
    format_prompt(om, prompt), generate(model, om, prompt, ...)   with the template, system
                                          and params layers applied; to_modelfile(om)

The `params` layer becomes default sampler settings (`SamplerDefaults`), the `template`
layer formats the prompt (`llamay.ollama.template`, a Go-template subset), the `system`
layer fills `.System`. Loading one, and names that may be in llamay's store or Ollama's,
are `llamay.library`'s (above both stores).
"""

from __future__ import annotations

from llamay.ollama.errors import OllamaStoreError, UnsupportedTemplateError
from llamay.ollama.layers import format_prompt, generate, gguf_chat_prompt, to_modelfile
from llamay.ollama.params import SamplerDefaults, cut_at_stops
from llamay.ollama.store import (
    FullName,
    OllamaModel,
    candidate_dirs,
    find_blob,
    find_model,
    find_store,
    from_manifest,
    list_models,
    resolve,
)

__all__ = [
    "FullName",
    "OllamaModel",
    "OllamaStoreError",
    "SamplerDefaults",
    "UnsupportedTemplateError",
    "candidate_dirs",
    "cut_at_stops",
    "find_blob",
    "find_model",
    "find_store",
    "format_prompt",
    "from_manifest",
    "generate",
    "gguf_chat_prompt",
    "list_models",
    "resolve",
    "to_modelfile",
]
