"""The FastAPI application: every API family over one set of models.

app = create_app({"smollm2": "/path/smollm2.gguf"}, api_key=None)
uvicorn.run(app, host="127.0.0.1", port=11435)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llamay.errors import LlamayError
from llamay.serve.context import expire_contexts
from llamay.serve.errors import (
    ApiError,
    error_body,
    error_fields,
    error_kind,
    family_of,
    to_http_status,
)
from llamay.serve.models import Models
from llamay.serve.state import ServerState

#: Paths that answer without an API key (health probes, and the model lists, which
#: llama-server leaves open too).
OPEN_PATHS = ("/health", "/api/version", "/", "/v1/models", "/models")


def _error(
    request: Request,
    status: int,
    message: str,
    param: str | None = None,
    kind: str | None = None,
    fields: dict | None = None,
) -> JSONResponse:
    family = family_of(request.url.path)
    body = error_body(family, status, message, param, kind, fields)
    return JSONResponse(body, status_code=status)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """(the message, the first field at fault: OpenAI's `param`)."""
    parts, params = [], []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg', 'invalid')}")
        params.append(loc or None)
    return "invalid request: " + "; ".join(parts), (params or [None])[0]


class ApiKeyCheck:
    """401 for requests without the server's API key (`Authorization: Bearer KEY` or
    `x-api-key: KEY`), except on OPEN_PATHS. Plain ASGI, not `@app.middleware("http")`:
    that wrapper hides the client's disconnect from the routes, and a non-streaming
    request must see it to stop generating."""

    def __init__(self, app, api_key: str):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            request = Request(scope)
            given = [request.headers.get("x-api-key") or ""]
            bearer = request.headers.get("authorization", "")
            if bearer.lower().startswith("bearer "):
                given.append(bearer[7:].strip())
            # either header may carry it (Anthropic's client sends both when given both)
            ok = [hmac.compare_digest(g.encode(), self.api_key.encode()) for g in given if g]
            if not any(ok):
                await _error(request, 401, "invalid or missing API key")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class JsonBodies:
    """Request bodies are JSON whatever their Content-Type says: `curl -d '{...}'` (every
    example of Ollama's api.md) sends application/x-www-form-urlencoded, others send
    none or text/plain, and Ollama and llama-server parse them as JSON all the same."""

    LOOSE = (b"", b"application/x-www-form-urlencoded", b"text/plain")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            given = dict(scope["headers"]).get(b"content-type", b"")
            if given.split(b";")[0].strip().lower() in self.LOOSE:
                scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


def create_app(
    models: Models | dict[str, str | os.PathLike] | None = None,
    *,
    api_key: str | None = None,
    max_tokens_limit: int | None = None,
    keep_alive: float = 300.0,
    n_ctx: int | None = None,
    parallel: int = 8,
    reap_interval: float = 1.0,
    warm_up: bool = False,
) -> FastAPI:
    """The server's app. `models`: a `Models` registry or {name: path}; `api_key`: required
    as `Authorization: Bearer KEY` or `x-api-key: KEY` when set; `max_tokens_limit`: a cap on
    what one request may generate; `keep_alive`: seconds an idle model stays loaded;
    `warm_up`: load and prime the configured models at start (`llamay.serve.readiness`)."""
    if not isinstance(models, Models):
        models = Models(models, n_ctx=n_ctx, parallel=parallel, default_keep_alive=keep_alive)
    st = ServerState(models=models, api_key=api_key, max_tokens_limit=max_tokens_limit)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        # Every streaming request waits on a thread for its next token.
        loop.set_default_executor(ThreadPoolExecutor(max_workers=256, thread_name_prefix="serve"))

        async def reaper():
            while True:
                await asyncio.sleep(reap_interval)
                await st.models.reap()
                expire_contexts(st)

        task = asyncio.create_task(reaper())
        if warm_up:
            from llamay.serve.readiness import warm_up as warming

            st.extra["warm_up_task"] = asyncio.create_task(warming(st))
        try:
            yield
        finally:
            task.cancel()
            if warm_up:
                st.extra["warm_up_task"].cancel()
            await st.models.close()

    from llamay import __version__ as version

    app = FastAPI(
        title="llamay",
        version=version,
        summary="OpenAI, Anthropic, Ollama and llama.cpp-compatible APIs over llamay's engine",
        lifespan=lifespan,
    )
    app.state.llamay = st

    app.add_middleware(JsonBodies)
    if st.api_key:
        app.add_middleware(ApiKeyCheck, api_key=st.api_key)
    # outermost: browsers' preflight OPTIONS is answered before the key check, as
    # llama-server and Ollama answer it (any origin; the key still guards the APIs)
    app.add_middleware(
        CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]
    )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error(request, exc.status, exc.message, exc.param, exc.kind)

    @app.exception_handler(LlamayError)
    async def llamay_error(request: Request, exc: LlamayError):
        status = to_http_status(exc)
        return _error(request, status, str(exc), None, error_kind(exc), error_fields(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return _error(request, 400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(request, exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        return _error(request, 500, f"internal error: {type(exc).__name__}: {exc}")

    from llamay.serve import (
        anthropic,
        chat_page,
        context,
        infill,
        llamacpp,
        lora_adapters,
        ollama,
        ollama_models,
        openai,
        responses,
        slots,
    )

    for module in (
        openai,
        responses,
        anthropic,
        ollama,
        ollama_models,
        llamacpp,
        lora_adapters,
        slots,
        infill,
        context,
        chat_page,
    ):
        app.include_router(module.router)
    return app


#: Seconds a stopping server (SIGTERM, Ctrl-C) waits for requests in flight before it
#: cancels them; a cancelled generation frees its slot and pages at once.
SHUTDOWN_GRACE_S = 3


def run_server(app: FastAPI, host: str, port: int) -> None:
    """Serve `app` until SIGTERM/SIGINT, then drain within SHUTDOWN_GRACE_S."""
    import uvicorn

    uvicorn.run(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int | None = None, timeout: float = 60.0
) -> Iterator[str]:
    """Serve `app` with uvicorn on a background thread until the block ends; yields the
    base URL (a free port when `port` is None)."""
    import uvicorn

    port = free_port(host) if port is None else port
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
    )
    thread = threading.Thread(target=server.run, name="llamay-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
