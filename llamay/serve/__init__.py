"""`llamay serve`: OpenAI, Anthropic, Ollama, llama.cpp-native and context APIs over one
engine per model. `create_app(...)` builds the FastAPI app."""

from llamay.serve.app import create_app

__all__ = ["create_app"]
