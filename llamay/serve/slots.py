"""llama-server's slots over llamay's engine slots.

    GET  /slots[?model=M][&fail_on_no_slot=1]     one object per engine slot of the model
    POST /slots/{id}?action=save     {"filename"}  the slot's last sequence, K/V and tokens
    POST /slots/{id}?action=restore  {"filename"}  back into the engine's prefix cache
    POST /slots/{id}?action=erase                  forget what the slot held

A slot "holds" the tokens of the last generation the engine ran in it (prompt and
completion: `ServerState.slot_tokens`), as a llama-server slot keeps its prompt cache.
Saving recomputes nothing that the prefix cache still has: the sequence is prefilled
with `keep=True` (the cached prefix is reused) and its K/V written as a llamay KV
snapshot (`llamay.kv.snapshot`) under the name the client gave, inside the server's
slot-save directory (`llamay serve --slot-save-path DIR`, llama-server's flag; without
it these actions are refused as llama-server refuses them, 501). Restoring loads the
K/V into the engine and the slot keeps them (a `kept.Kept`, and the snapshot on the
host): a /completion or /infill whose prompt begins with all of those tokens continues
from them, one that shares at least MIN_REUSE leading tokens restores that much of the
snapshot again (`tokens_cached`, `timings.cache_n`), as a llama-server slot reuses its
cache's common prefix. Erase drops the slot's
kept K/V and forgets its tokens (pages the shared prefix cache also holds stay there
until the pool needs them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import APIRouter, Query, Request

from llamay.errors import LlamayError, SnapshotError
from llamay.kv.snapshot import Snapshot
from llamay.serve import kept
from llamay.serve.core import OpenModel
from llamay.serve.errors import ApiError
from llamay.serve.models import Loaded
from llamay.serve.sampling import make_sampler
from llamay.serve.state import ServerState, state

router = APIRouter(tags=["llama.cpp"])

#: llama.cpp's LLAMA_DEFAULT_SEED: what llama-server shows for "no seed" (random).
DEFAULT_SEED = 0xFFFFFFFF
#: Seconds a save/restore waits for its slot to finish the request it runs (llama-server
#: defers the action until the slot is idle).
WAIT_IDLE_S = 60.0
#: Fewest leading tokens a prompt must share with a restored slot for its K/V to be used.
MIN_REUSE = 16
_BAD_CHARS = set(':*?"<>|/\\') | {"\ufeff", "\ufffd", "\uff0e", "\u2215", "\u2216"}


class SlotFile(OpenModel):
    filename: str | None = None


def valid_filename(name: str) -> bool:
    """llama.cpp's fs_validate_filename (no subdirectories): a plain file name that
    cannot leave the directory it is joined to."""
    if not name or len(name.encode("utf-8", "surrogatepass")) > 255:
        return False
    for ch in name:
        c = ord(ch)
        if c <= 0x1F or c == 0x7F or 0x80 <= c <= 0x9F or 0xD800 <= c <= 0xDFFF:
            return False
        if ch in _BAD_CHARS:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name or name == ".")


def slot_save_dir(st: ServerState) -> Path:
    d = st.extra.get("slot_save_path")
    if not d:
        raise ApiError(
            501,
            "This server does not support slots action. Start it with `--slot-save-path`",
            kind="not_supported_error",
        )
    return Path(d)


def _file_in(directory: Path, name: str | None) -> Path:
    if not isinstance(name, str) or not valid_filename(name):
        raise ApiError(400, "Invalid filename", param="filename", kind="invalid_request_error")
    path = directory / name
    if path.resolve().parent != directory.resolve():  # a symlinked name, say
        raise ApiError(400, "Invalid filename", param="filename", kind="invalid_request_error")
    return path


def generation_params(
    sampler: Any,
    n_predict: int = -1,
    n_probs: int = 0,
    ignore_eos: bool = False,
    **more: Any,
) -> dict[str, Any]:
    """A generation's settings with llama-server's names, as its /slots `params`, /props
    `default_generation_settings.params` and /completion `generation_settings` show
    them; `more`: settings of the request besides these."""
    p = dataclasses.asdict(sampler)
    p["seed"] = DEFAULT_SEED if p["seed"] is None else p["seed"]
    p["samplers"] = list(p["samplers"])
    p["dry_sequence_breakers"] = list(p["dry_sequence_breakers"])
    # as llama-server lists them; a banned token's -inf is null (JSON has no infinity)
    p["logit_bias"] = [
        {"bias": None if math.isinf(b) else b, "token": t} for t, b in p["logit_bias"]
    ]
    p.update(
        n_predict=n_predict,
        max_tokens=n_predict,
        n_probs=n_probs,
        ignore_eos=ignore_eos,
        n_keep=0,
        n_discard=0,
        stream=False,
        timings_per_token=False,
        post_sampling_probs=False,
        lora=[],
    )
    return {**p, **more}


def _params(lm: Loaded, active: Any) -> dict[str, Any]:
    """A slot's `params` (the default settings when idle)."""
    if active is None:
        return generation_params(make_sampler())
    request = active.handle.request
    return generation_params(
        active.sampler,
        request.max_tokens,
        active.logprobs or 0,
        request.stop_ids == frozenset(),
    )


def _slot_json(st: ServerState, lm: Loaded, i: int, active: Any) -> dict[str, Any]:
    busy = active is not None
    n_decoded = active.handle.usage.completion_tokens if busy else 0
    has_new_line = False
    if busy and n_decoded and active.seq is not None:
        tail = list(active.seq.tokens[-n_decoded:])
        has_new_line = "\n" in lm.model.detokenize(tail)
    task = active.handle.id if busy else None
    return {
        "id": i,
        "id_task": int(task.rsplit("-", 1)[-1]) if task and task[-1].isdigit() else -1,
        "n_ctx": lm.model.n_ctx,
        "speculative": False,
        "is_processing": busy,
        "n_prompt_tokens": active.handle.usage.prompt_tokens if busy else 0,
        "n_prompt_tokens_cache": active.handle.usage.cached_tokens if busy else 0,
        "params": _params(lm, active),
        "next_token": {
            "has_next_token": busy,
            "has_new_line": has_new_line,
            "n_remain": active.budget if busy else -1,
            "n_decoded": n_decoded,
        },
        # llamay's: which model, and how many tokens the slot holds (for save)
        "model": lm.name,
        "n_cached": len(st.slot_tokens.get((lm.name, i), ())),
    }


def occupants(st: ServerState, lm: Loaded) -> list[Any]:
    slots = getattr(lm.engine, "slots", None)
    return list(slots) if slots is not None else [None] * max(1, st.models.parallel)


@router.get("/slots", summary="Each slot's state (llama.cpp)")
async def slots(request: Request, model: str | None = None, fail_on_no_slot: str | None = None):
    """One object per engine slot of the default (or `?model=`) model, as llama-server's
    /slots: id, n_ctx, is_processing, params, next_token. `?fail_on_no_slot=1`: 503 when
    every slot is busy."""
    st = state(request)
    lm = await st.models.get(model, lenient=True)
    held = occupants(st, lm)
    if fail_on_no_slot and all(a is not None for a in held):
        raise ApiError(503, "no slot available", kind="unavailable_error")
    return [_slot_json(st, lm, i, a) for i, a in enumerate(held)]


def _kept(st: ServerState) -> dict[tuple[str, int], tuple[kept.Kept, Snapshot]]:
    """(model, slot) -> the K/V a restore left in that slot (in the engine, and the
    snapshot on the host)."""
    return st.extra.setdefault("slot_kept", {})


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if len(diff) else n


def restored_for(st: ServerState, lm: Loaded, ids: list[int]):
    """How to start a generation of `ids` from a restored slot's K/V (a `TextGen` start
    function), else None: a fork of them when `ids` begin with all of the slot's tokens,
    else, when they share at least MIN_REUSE leading tokens, the snapshot cut there and
    restored again (llama-server's slots reuse their cache's common prefix too)."""
    best = None
    for (name, _), (kv, snap) in list(_kept(st).items()):
        if name != lm.name:
            continue
        if len(kv.tokens) < len(ids) and kv.usable_for(lm.engine, ids):

            async def fork(request, kv=kv):
                return await kept.start(lm.engine, request, kv)

            return fork
        n = min(_common(snap.tokens, ids), snap.n_cached, len(ids) - 1)
        if n >= MIN_REUSE and (best is None or n > best[0]):
            best = (n, snap)
    if best is None:
        return None
    n, snap = best
    cut = dataclasses.replace(snap, tokens=list(snap.tokens[:n]), k=snap.k[:, :n], v=snap.v[:, :n])

    async def restore(request):
        return await kept.start(lm.engine, request, snapshot=cut)

    return restore


def _cut(images, n: int) -> tuple:
    """The `ImageSpan`s over the first `n` positions (one cut at n keeps its first rows)."""
    return tuple(
        dataclasses.replace(im, embeddings=im.embeddings[: n - im.start])
        for im in images
        if im.start < n
    )


async def _wait_idle(st: ServerState, lm: Loaded, i: int) -> None:
    deadline = time.monotonic() + WAIT_IDLE_S
    while occupants(st, lm)[i] is not None:
        if time.monotonic() > deadline:
            raise ApiError(503, f"slot {i} stayed busy", kind="unavailable_error")
        await asyncio.sleep(0.05)


@router.post("/slots/{id_slot}", summary="Save, restore or erase a slot's cache (llama.cpp)")
async def slot_action(
    id_slot: str,
    request: Request,
    action: str = Query(""),
    model: str | None = None,
    body: SlotFile | None = None,
):
    """llama-server's slot actions; `filename` names a file in --slot-save-path."""
    st = state(request)
    directory = slot_save_dir(st)
    lm = await st.models.get(model, lenient=True)
    try:
        i = int(id_slot)
    except ValueError:
        raise ApiError(400, "Invalid slot ID", kind="invalid_request_error") from None
    if not 0 <= i < len(occupants(st, lm)):
        raise ApiError(400, "Invalid slot ID", kind="invalid_request_error")
    if action == "erase":
        n = len(st.slot_tokens.pop((lm.name, i), ()))
        st.slot_images.pop((lm.name, i), None)
        held = _kept(st).pop((lm.name, i), None)
        if held is not None:
            held[0].drop()
        return {"id_slot": i, "n_erased": n}
    if action not in ("save", "restore"):
        raise ApiError(400, "Invalid action", kind="invalid_request_error")
    path = _file_in(directory, body.filename if body is not None else None)
    if not kept.supports_kv(lm.engine):
        raise ApiError(501, "this engine keeps no KV to save", kind="not_supported_error")
    await _wait_idle(st, lm, i)
    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    if action == "save":
        tokens = st.slot_tokens.get((lm.name, i), [])
        if len(tokens) < 2:
            raise ApiError(400, f"slot {i} holds no sequence to save", kind="invalid_request_error")
        images = st.slot_images.get((lm.name, i), ())
        if tokens[-1] < 0 or (not images and min(tokens) < 0):
            raise ApiError(
                400,
                f"slot {i}'s sequence ends inside an image"
                if tokens[-1] < 0
                else f"slot {i} holds image K/V restored from a file, not the images: run "
                "the request with its images again to save it",
                kind="invalid_request_error",
            )
        # the last token was sampled, never fed: its K/V does not exist (llama.cpp's too);
        # images' K/V are saved as any (their positions keep the placeholder ids, so a
        # restore gives later requests with the same image its cached pages)
        seq = await kept.prefill(lm.engine, tokens[:-1], images=_cut(images, len(tokens) - 1))
        try:
            snap = await kept.snapshot_of(seq)
        finally:
            seq.drop()
        snap = dataclasses.replace(snap, tokens=list(tokens))
        directory.mkdir(parents=True, exist_ok=True)
        await loop.run_in_executor(None, snap.write, path)
        return {
            "id_slot": i,
            "filename": path.name,
            "n_saved": len(tokens),
            "n_written": path.stat().st_size,
            "timings": {"save_ms": (time.perf_counter() - t0) * 1e3},
        }
    if not path.is_file():
        raise ApiError(400, f"Unable to restore slot, no file {path.name!r}", param="filename")
    try:
        snap: Snapshot = await loop.run_in_executor(None, lambda: Snapshot.load(path, named=False))
        # into the engine, then its pages to the prefix cache (release caches them)
        seq = await kept.prefill(lm.engine, list(snap.tokens), snapshot=snap)
    except SnapshotError as exc:
        raise ApiError(400, f"Unable to restore slot: {exc}", param="filename") from None
    except LlamayError:
        raise
    old = _kept(st).pop((lm.name, i), None)
    if old is not None:
        old[0].drop()
    _kept(st)[(lm.name, i)] = (seq, snap)
    st.hold_slot(lm.name, i, snap.tokens)  # its images' K/V only: the images are not kept
    return {
        "id_slot": i,
        "filename": path.name,
        "n_restored": len(snap.tokens),
        "n_read": path.stat().st_size,
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3},
    }
