"""llamay: a JAX-compiled, functional inference engine for GGUF language models.

`llamay.load` and `llamay.Model` are imported lazily, so `import llamay.gguf`
(numpy only) does not pull in JAX.
"""

__version__ = "0.1.0"
__all__ = ["Model", "load"]


def __getattr__(name: str):
    if name in __all__:
        from llamay import api

        return getattr(api, name)
    raise AttributeError(f"module 'llamay' has no attribute {name!r}")
