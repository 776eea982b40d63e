"""llama-server's LoRA adapters: `GET /lora-adapters` (id, path, scale of each adapter the
default model loaded, `llamay serve --lora`), `POST /lora-adapters` (the global scales:
[{"id": 0, "scale": 0.2}], the adapters not listed off) and the per-request `lora` field
of /completion, /v1/completions and /v1/chat/completions ([{"id": 0, "scale": 0.5}], the
others at 0; absent: the global scales), read by `request_lora`. Requests with different
adapters (or none) share the batch (`llamay.engine.adapters`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Body, Request

from llamay.errors import RequestError
from llamay.serve.core import off_loop
from llamay.serve.errors import ApiError
from llamay.serve.models import Loaded
from llamay.serve.state import state

router = APIRouter(tags=["llama.cpp"])

MAX_ENTRIES = 64


def _entries(raw: Any, field: str, n: int) -> dict[int, float]:
    """{id: scale} of llama-server's [{"id": i, "scale": s}, ...] (ApiError 400 else)."""
    if not isinstance(raw, list):
        raise ApiError(
            400, f'{field} must be a list of {{"id": int, "scale": number}}', param=field
        )
    if len(raw) > MAX_ENTRIES:
        raise ApiError(400, f"{field}: at most {MAX_ENTRIES} entries", param=field)
    out: dict[int, float] = {}
    for e in raw:
        if not isinstance(e, Mapping):
            raise ApiError(400, f"{field}: each entry is an object with id and scale", param=field)
        i, s = e.get("id", -1), e.get("scale", 0.0)
        if isinstance(i, float) and i.is_integer():  # JSON's 0.0 is id 0, as llama-server reads it
            i = int(i)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
            raise ApiError(
                400, f"{field}: invalid adapter id {i!r} (the model has {n})", param=field
            )
        if isinstance(s, bool) or not isinstance(s, int | float):
            raise ApiError(400, f"{field}: adapter {i}'s scale must be a number", param=field)
        out[i] = float(s)
    return out


def _count(lm: Loaded) -> int:
    return len(getattr(lm.model, "adapters", None) or ())


def request_lora(lm: Loaded, extras: Mapping[str, Any] | None) -> dict[int, float] | None:
    """A request's `lora` field as the engine's {adapter id: scale}; None when absent."""
    raw = (extras or {}).get("lora")
    if raw is None:
        return None
    out = _entries(raw, "lora", _count(lm))
    try:  # the engine's own check (finite, in range) as a 400 here
        from llamay.engine.adapters import request_scales

        request_scales(out, _count(lm), [])
    except RequestError as e:
        raise ApiError(400, str(e), param="lora") from None
    return out


def listing(lm: Loaded) -> list[dict[str, Any]]:
    """llama-server's GET /lora-adapters entries (its task_name and prompt_prefix: the
    adapter's adapter.lora.task_name / adapter.lora.prompt_prefix, "" without)."""
    from llamay.gguf import GGUFFile

    scales = getattr(lm.engine, "lora_scales", ())
    out = []
    for i, ad in enumerate(getattr(lm.model, "adapters", None) or ()):
        meta = GGUFFile(ad.path).metadata
        out.append(
            {
                "id": i,
                "path": str(ad.path),
                "scale": float(str(scales[i])),  # f32's shortest form: 0.7, not 0.69999...
                "task_name": str(meta.get("adapter.lora.task_name", "")),
                "prompt_prefix": str(meta.get("adapter.lora.prompt_prefix", "")),
            }
        )
    return out


@router.get("/lora-adapters", summary="The LoRA adapters and their global scales (llama.cpp)")
async def get_adapters(request: Request, model: str | None = None):
    lm = await state(request).models.get(model, lenient=True)
    return await off_loop(listing, lm)


@router.post("/lora-adapters", summary="Set the LoRA adapters' global scales (llama.cpp)")
async def set_adapters(request: Request, body: Any = Body(...), model: str | None = None):
    lm = await state(request).models.get(model, lenient=True)
    scales = _entries(body, "body", _count(lm))
    try:
        lm.engine.set_lora_scales(scales)
    except RequestError as e:
        raise ApiError(400, str(e)) from None
    return {"success": True}
