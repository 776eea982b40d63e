"""Errors of the Ollama-store reader (kept here until `llamay/errors.py` adopts them)."""

from __future__ import annotations

from llamay.errors import LlamayError


class OllamaStoreError(LlamayError):
    """An Ollama store or one of its models cannot be read (missing blob, bad manifest,
    malformed params layer)."""


class UnsupportedTemplateError(LlamayError):
    """An Ollama (Go) template uses a construct llamay's small renderer does not support."""
