"""llama-server's POST /infill: fill-in-the-middle for code editors (llama.vim,
llama.vscode), with every /completion option.

The prompt is laid out as llama.cpp's format_prompt_infill lays it out, from the FIM
tokens the GGUF names (`tokenizer.ggml.fim_pre_token_id`, `fim_suf`, `fim_mid`,
`fim_rep`, `fim_sep`, or llama.cpp's known token texts):

    [extra] [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>

where `extra` is the repo-level pattern when the model has FIM_REP and FIM_SEP
(`<FIM_REP>myproject\\n <FIM_SEP>{filename}\\n{text} ... <FIM_SEP>filename\\n`), else each
`input_extra` chunk after llama.cpp's "--- snippet ---" separator. The prefix keeps its
last 3/4 of a batch (n_batch 2048, llama-server's default) of tokens, the suffix its first
batch/4 - 2 - len(prompt), the extra chunks the room the context has left
(n_ctx - n_batch - 2 * n_predict, with the server's n_predict, -1: llama-server's
default), their last tokens. A model without the three FIM
tokens gets llama-server's 501 "Infill is not supported by this model".
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from llamay.serve.core import off_loop
from llamay.serve.errors import ApiError
from llamay.serve.fim import REQUIRED_ROLES, fim_token_ids, layout, missing_roles
from llamay.serve.llamacpp import CompletionRequest, _prompt_ids, complete
from llamay.serve.models import Loaded
from llamay.serve.state import state

router = APIRouter(tags=["llama.cpp"])

#: llama-server's default --batch-size, which bounds the prefix and suffix kept.
N_BATCH = 2048
#: llama-server's default -n (the server's, not the request's, sizes the extra context).
SERVER_N_PREDICT = -1
#: llama.cpp's chunk separator when the model has no FIM_SEP token.
SNIPPET = "\n\n--- snippet ---\n\n"


class InfillRequest(CompletionRequest):
    input_prefix: str | list[Any] | None = None
    input_suffix: str | list[Any] | None = None
    input_extra: list[dict[str, Any]] | None = None


def fim_ids(lm: Loaded) -> dict[str, int | None]:
    """The model's FIM token ids (pre, suf, mid required): 501 naming the missing ones, in
    llama-server's words."""
    ids = fim_token_ids(lm)
    missing = "".join(f"{REQUIRED_ROLES[r]} token is missing. " for r in missing_roles(ids))
    if missing:
        raise ApiError(
            501, f"Infill is not supported by this model: {missing}", kind="not_supported_error"
        )
    return ids


def infill_prompt(
    lm: Loaded,
    prefix: str | list,
    suffix: str | list,
    extra: list[dict[str, Any]],
    prompt: str,
    n_predict: int = SERVER_N_PREDICT,
    n_batch: int = N_BATCH,
) -> list[int]:
    """The token ids of an infill request (llama.cpp's format_prompt_infill, not SPM)."""
    ids = fim_ids(lm)
    model = lm.model

    def tok(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False) if text else []

    def mixed(x: str | list) -> list[int]:
        return tok(x) if isinstance(x, str) else _prompt_ids(lm, x) if x else []

    extra_ids: list[int] = []
    if ids["rep"] is not None:
        extra_ids += [ids["rep"], *tok("myproject\n")]
    for chunk in extra:
        if ids["sep"] is not None:
            extra_ids += [ids["sep"], *tok(chunk.get("filename", "tmp") + "\n")]
        else:
            extra_ids += tok(SNIPPET)
        extra_ids += tok(chunk["text"])
    if ids["sep"] is not None:
        extra_ids += [ids["sep"], *tok("filename\n")]
    # the prompt is tokenised with special tokens parsed, as llama-server's prompts are
    prompt_ids = model.tokenize(prompt, add_special=False, parse_special=True) if prompt else []
    pre, suf = mixed(prefix), mixed(suffix)
    n_pre = min(len(pre), 3 * (n_batch // 4))
    n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, model.n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    kept = extra_ids[len(extra_ids) - n_extra :] if n_extra else []
    return [*kept, *layout(lm, ids, [*pre[len(pre) - n_pre :], *prompt_ids], suf[:n_suf])]


def _check(body: InfillRequest) -> list[dict[str, Any]]:
    if body.input_prefix is None:
        raise ApiError(400, '"input_prefix" is required', param="input_prefix")
    if body.input_suffix is None:
        raise ApiError(400, '"input_suffix" is required', param="input_suffix")
    if not isinstance(body.prompt, str):
        raise ApiError(400, '"prompt" must be a string', param="prompt")
    extra = body.input_extra or []
    for chunk in extra:
        if not isinstance(chunk.get("text"), str):
            raise ApiError(
                400,
                'extra_context chunk must contain a "text" field with a string value',
                param="input_extra",
            )
        if "filename" in chunk and not isinstance(chunk["filename"], str):
            raise ApiError(
                400,
                'extra_context chunk\'s "filename" field must be a string',
                param="input_extra",
            )
    return extra


@router.post("/infill", summary="Fill in the middle of code (llama.cpp)")
async def infill(body: InfillRequest, request: Request):
    """`input_prefix` and `input_suffix` (required), `input_extra` ([{filename, text}]),
    `prompt` (text the middle starts with), and every /completion option."""
    st = state(request)
    lm = await st.models.get(body.model, lenient=True)
    fim_ids(lm)  # llama-server checks the model first
    extra = _check(body)
    ids = await off_loop(
        infill_prompt,
        lm,
        body.input_prefix,
        body.input_suffix,
        extra,
        body.prompt,
    )
    return await complete(st, lm, body, [ids], request)
