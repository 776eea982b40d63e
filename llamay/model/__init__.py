"""Binding GGUF tensors to an architecture's weights; the forward pass and step functions."""

from llamay.model.bind import bind
from llamay.model.forward import forward, logits_step

__all__ = ["bind", "forward", "logits_step"]
