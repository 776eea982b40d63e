"""The models a server knows, loaded on demand and unloaded after their keep-alive.

    models = Models({"tiny": "/path/tiny.gguf"}, default_keep_alive=300)
    lm = await models.get("tiny")           # loads once (concurrent callers share the load)
    lm.model, lm.engine                      # a llamay.Model and the engine serving it
    await models.unload("tiny")

Names a request may use: the configured ones (`-m NAME=PATH` or `-m NAME`), and the names in
the local store. Nothing is fetched on demand: pulling is `/api/pull`'s job.

The engine is chosen in one place, `make_engine`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from llamay.errors import AdapterError, ModelNotFoundError, ProjectorError


def make_engine(model, parallel: int = 8, speculative=None):
    """The engine serving one model (the one place where the engine is chosen):
    continuous batching (`BatchEngine`, `parallel` slots) for every request, constrained
    ones included (their token masks ride in the batch); `speculative`: its
    `llamay.engine.speculative.Speculation` (--model-draft), or None."""
    from llamay.engine.scheduler import BatchEngine, default_decode_steps

    slots, page = max(1, parallel), 16
    # the scheduler's default pool, but never too small for one full context (the
    # engine reserves a position past a sequence's last token: n_ctx + 1 positions)
    full = -(-(model.n_ctx + 1) // page)
    n_pages = max(slots * -(-min(model.n_ctx, 1024) // page), full) + 1
    # clients' concurrent requests reach the engine one by one: gather them into one
    # first step (`BatchEngine` gather_s) rather than compile a step per arrival pattern
    return BatchEngine(
        model,
        slots=slots,
        page_size=page,
        n_pages=n_pages,
        gather_s=0.025,
        speculative=speculative,
        decode_steps=default_decode_steps(),
    )


@dataclass
class Known:
    """A model a request may name, loaded or not."""

    name: str
    path: Path
    size: int = 0
    modified: datetime | None = None
    digest: str = ""
    #: The store manifest's extra layers by media type (template, system, params,
    #: projector) → blob.
    layers: dict[str, Path] = field(default_factory=dict)
    #: LoRA adapters it loads with, [(path, scale)]: its ADAPTER layers (Ollama applies
    #: them at scale 1), and `llamay serve --lora` for the default model.
    adapters: tuple[tuple[Path, float], ...] = ()

    @property
    def created(self) -> int:
        return int((self.modified or datetime.now(UTC)).timestamp())


def _projector(known: Known) -> Path | None:
    from llamay.store import manifest as media

    return known.layers.get(media.PROJECTOR)


@dataclass
class Loaded:
    known: Known
    model: Any
    engine: Any
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    expires_at: float | None = None  # None: never
    busy: int = 0  # requests in flight
    last_get: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.known.name


def _file_info(path: Path) -> tuple[int, datetime | None]:
    try:
        st = path.stat()
    except OSError:
        return 0, None
    return st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)


def _path_digest(path: Path) -> str:
    # A cheap stable id for a file outside the store (not its content hash).
    return "sha256:" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()


def default_loader(path: Path, n_ctx: int | None, numerics: str, lora=(), **options):
    """`options`: cache_type_k / cache_type_v / flash_attn (`llamay.load`'s)."""
    import llamay

    model = llamay.load(path, n_ctx=n_ctx, numerics=numerics, progress=False, lora=lora, **options)
    # A server outlives the tokenizer's per-text engines: build the full one while
    # loading rather than stall a request on it later (it holds the GIL for seconds).
    model.tokenizer.warm()
    return model


def _make_mesh(text: str | None):
    """The device mesh for "dp=N,tp=M" (None for none, or a single device)."""
    if not text:
        return None
    from llamay.model.sharding import make_mesh, parse_mesh

    sizes = parse_mesh(text)
    if sizes["data"] * sizes["model"] == 1:
        return None
    return make_mesh(sizes)


class Models:
    """Configured and stored models, loaded on demand, each with its own engine."""

    def __init__(
        self,
        configured: dict[str, str | os.PathLike] | None = None,
        *,
        n_ctx: int | None = None,
        numerics: str = "exact",
        parallel: int = 8,
        default_keep_alive: float = 300.0,
        use_store: bool = True,
        loader: Callable[..., Any] = default_loader,
        engine_factory: Callable[..., Any] | None = None,
        mesh: str | None = None,
        pooling: str | None = None,
        lora: list[tuple[str | os.PathLike, float]] | None = None,
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        mmproj: str | os.PathLike | None = None,
        flash_attn: bool | str | None = None,
    ):
        """`mesh`: shard every model over devices, "dp=N,tp=M" (llamay.model.sharding's
        rules, as `llamay eval --mesh`); checked against the visible devices here.
        `pooling`: every model's embedding pooling (llama-server's --pooling), else each
        GGUF's own. `lora`: LoRA adapters [(path, scale)] the default model loads with
        (llama-server's --lora; `/lora-adapters` lists them and sets their scales).
        `cache_type_k` / `cache_type_v`: every model's KV cache types (llama-server's
        --cache-type-k/-v: f32, f16, bf16, q8_0, q5_1, q5_0, q4_1, q4_0; `llamay.kv.types`).
        `mmproj`: the default model's vision projector (llama-server's --mmproj).
        `numerics` and `flash_attn`: every model's rounding (`llamay.load`'s: "llamacpp"
        reproduces llama.cpp's, flash attention's among them when `flash_attn` is on)."""
        #: what every model loads with besides its path (the loader's keyword arguments)
        self.load_options = {
            k: v
            for k, v in (
                ("cache_type_k", cache_type_k),
                ("cache_type_v", cache_type_v),
                ("flash_attn", flash_attn),
            )
            if v is not None
        }
        self.lora = tuple((Path(p), float(s)) for p, s in lora or ())
        if self.lora and not configured:
            raise AdapterError("LoRA adapters (--lora) are for the first --model: give one")
        for p, _ in self.lora:
            if not p.is_file():
                raise AdapterError(f"{p}: no such LoRA adapter file")
        self.mmproj = Path(mmproj) if mmproj is not None else None
        if self.mmproj is not None and not configured:
            raise ProjectorError("a vision projector (--mmproj) is for the first --model: give one")
        if self.mmproj is not None and not self.mmproj.is_file():
            raise ProjectorError(f"{self.mmproj}: no such projector file")
        self.pooling = pooling
        self.mesh = _make_mesh(mesh)
        self.configured = {k: Path(v) for k, v in (configured or {}).items()}
        self.n_ctx = n_ctx
        self.numerics = numerics
        self.parallel = parallel
        self.default_keep_alive = default_keep_alive
        self.use_store = use_store
        self.loader = loader
        self.engine_factory = engine_factory or make_engine
        self.loaded: dict[str, Loaded] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    # -- names -----------------------------------------------------------------------------

    @property
    def default_name(self) -> str | None:
        if self.configured:
            return next(iter(self.configured))
        return next(iter(self.loaded), None)

    def known(self) -> list[Known]:
        out: dict[str, Known] = {}
        for name, path in self.configured.items():
            size, modified = _file_info(path)
            out[name] = Known(name, path, size, modified, _path_digest(path))
        if self.lora and out:
            first = next(iter(out.values()))
            first.adapters = self.lora
        if self.use_store:
            from llamay.store import list_models

            try:
                entries = list_models()
            except Exception:  # an unreadable store lists nothing rather than failing
                entries = []
            from llamay.store import manifest as media

            for e in entries:
                layers = {}
                for mt in (media.TEMPLATE, media.SYSTEM, media.PARAMS, media.PROJECTOR):
                    p = e.layer_path(mt)
                    if p is not None:
                        layers[mt] = p
                adapters = tuple((p, 1.0) for p in e.adapter_paths())
                out.setdefault(
                    e.name, Known(e.name, e.path, e.size, e.modified, e.digest, layers, adapters)
                )
        return list(out.values())

    def find(self, name: str | None, lenient: bool = False) -> Known:
        """The model `name` refers to (None or "": the default model). `lenient`: when
        the server has exactly one model, or was started with exactly one (`-m`, the
        store's other models loadable on demand), a name it does not know means that one
        (llama-server answers `"model": "gpt-3.5-turbo"` so; OpenAI and Anthropic clients
        must send a name)."""
        if not name:
            name = self.default_name
            if name is None:
                raise ModelNotFoundError("no model given and the server has no default model")
        if name in self.loaded:
            return self.loaded[name].known
        candidates = [name, name.removesuffix(":latest")]
        if ":" not in name:
            candidates.append(f"{name}:latest")
        known = self.known()
        for cand in candidates:
            for k in known:
                if k.name == cand:
                    return k
        if lenient and len(known) == 1:
            return known[0]
        if lenient and len(self.configured) == 1:
            return next(k for k in known if k.name in self.configured)
        names = ", ".join(k.name for k in known) or "(none)"
        raise ModelNotFoundError(f"model {name!r} is not available on this server; it has: {names}")

    # -- loading ---------------------------------------------------------------------------

    def _expiry(self, keep_alive: float | None) -> float | None:
        ka = self.default_keep_alive if keep_alive is None else keep_alive
        return None if ka < 0 else time.time() + ka

    async def get(
        self, name: str | None, keep_alive: float | None = None, lenient: bool = False
    ) -> Loaded:
        """The loaded model `name` (as `find` reads it), loading it first if needed."""
        known = self.find(name, lenient)
        lock = self._locks.setdefault(known.name, asyncio.Lock())
        async with lock:
            lm = self.loaded.get(known.name)
            if lm is None:
                t0 = time.perf_counter()
                loop = asyncio.get_running_loop()
                model = await loop.run_in_executor(
                    None, self._load, known.path, known.adapters, _projector(known)
                )
                draft = await loop.run_in_executor(None, self._drafting, known)
                engine = self.engine_factory(model, self.parallel, **draft)
                lm = Loaded(known, model, engine, load_seconds=time.perf_counter() - t0)
                self.loaded[known.name] = lm
            lm.expires_at = self._expiry(keep_alive)
            lm.last_get = time.time()
            return lm

    #: `llamay serve --model-draft`: {"draft": "ngram" or a model path/name, "draft_max",
    #: "draft_min", "p_min"} for the default model's engine, or None
    speculative: dict | None = None

    def _drafting(self, known: Known) -> dict:
        """The engine factory's speculative argument for `known` (the default model,
        with --model-draft: its draft loaded here), else none."""
        spec = self.speculative
        if not spec or known.name != self.default_name:
            return {}
        from llamay.serve.speculative import speculation

        def load(draft):
            return self.loader(draft, self.n_ctx, self.numerics)

        opts = {k: v for k, v in spec.items() if k != "draft"}
        return {"speculative": speculation(spec["draft"], load, **opts)}

    def _load(self, path: Path, adapters=(), projector: Path | None = None):
        """`projector`: the model's own vision projector (its store `projector` layer)."""
        lora = {"lora": list(adapters)} if adapters else {}  # custom loaders may take none
        model = self.loader(path, self.n_ctx, self.numerics, **lora, **self.load_options)
        if self.mmproj is not None and path == next(iter(self.configured.values())):
            model.attach_projector(self.mmproj)
        elif projector is not None:
            model.attach_projector(projector)
        if self.pooling is not None:
            model.pooling = self.pooling
        if self.mesh is not None:
            from llamay.model.sharding import sharded_model

            model = sharded_model(model, self.mesh)
        return model

    def touch(self, lm: Loaded, keep_alive: float | None = None) -> None:
        lm.expires_at = self._expiry(keep_alive)

    async def unload(self, name: str) -> bool:
        lm = self.loaded.pop(name, None)
        if lm is None:
            return False
        await asyncio.get_running_loop().run_in_executor(None, lm.engine.close)
        return True

    #: A model handed out this recently is not reaped (its request may not have started).
    GRACE_S = 2.0

    async def reap(self) -> None:
        """Unload every idle model whose keep-alive has run out."""
        now = time.time()
        for name, lm in list(self.loaded.items()):
            if (
                lm.busy == 0
                and lm.expires_at is not None
                and lm.expires_at <= now
                and now - lm.last_get >= self.GRACE_S
            ):
                await self.unload(name)

    async def unload_when_idle(self, name: str) -> bool:
        """Unload `name` now if nothing uses it, else as soon as its requests end."""
        lm = self.loaded.get(name)
        if lm is None:
            return False
        if lm.busy:
            lm.expires_at = time.time()
            return True
        return await self.unload(name)

    async def close(self) -> None:
        for name in list(self.loaded):
            await self.unload(name)
