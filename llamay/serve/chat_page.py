"""The chat page at `/`: a small static page (chat_page.html) that streams from the
server's own OpenAI API, with a model picker, a stop button and the common samplers.
Clients that do not ask for HTML get Ollama's plain liveness answer instead."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, PlainTextResponse

router = APIRouter(tags=["Chat page"])


@lru_cache(maxsize=1)
def page() -> str:
    return (Path(__file__).with_name("chat_page.html")).read_text(encoding="utf-8")


@router.get("/", summary="The chat page (HTML), or a liveness line")
async def root(request: Request):
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(page())
    return PlainTextResponse("llamay is running")  # `curl /`, as Ollama answers it
