"""The request side over model + kv + sample: step functions and generation."""

from llamay.engine.generate import Generation, Runtime, check_prompt, padded_batch

__all__ = ["Generation", "Runtime", "check_prompt", "padded_batch"]
