"""Images in HTTP requests (issue 25): data URLs and base64 payloads to bytes, and a
generation over an image prompt for `TextGen` (its `start` hook).

Image requests run in the model's batching engine like any other (`llamay.multimodal`: the
prompt laid out as llama.cpp's mtmd lays it out, each image's embeddings carried by the
request and fed in place of its placeholder ids, which the prefix tree keys by the image's
content). http(s) image URLs are refused: the server fetches nothing from the network.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses

from llamay.engine.api import Handle, Request
from llamay.errors import ImageError
from llamay.vision import MEDIA_MARKER

__all__ = ["MEDIA_MARKER", "ImageIds", "decode_base64", "image_prompt", "url_bytes"]


class ImageIds(list):
    """An image prompt's ids (0 at image positions) carrying its `start` for `TextGen` and
    its `prompt` (the `ImagePrompt`: placeholder ids and image spans, for a prefill-only
    request), where a prompt travels as a list of ids (llama-server's /completion)."""

    start = None
    prompt = None


def decode_base64(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"{where}: the image is not valid base64 ({e})") from None


def url_bytes(url: str, where: str) -> bytes:
    """The bytes of an image URL: `data:[<mime>];base64,<data>` only."""
    if not isinstance(url, str):
        raise ImageError(f"{where}: an image URL must be a string")
    low = url[:8].lower()
    if low.startswith(("http://", "https://")):
        raise ImageError(
            f"{where}: image URLs are not fetched (the server has no network access): "
            "send the image inline as a data: URL (data:image/png;base64,...)"
        )
    if not low.startswith("data:"):
        raise ImageError(f"{where}: an image URL must be a data: URL (data:image/png;base64,...)")
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise ImageError(f"{where}: only base64 data: URLs are supported (data:<mime>;base64,...)")
    return decode_base64(data, where)


def image_prompt(lm, text: str, images: list[bytes]):
    """(prompt ids for counting, an `ImageIds`; `start` for `TextGen`) of a rendered prompt
    with one `<__media__>` per image. The ids hold 0 at image positions (what the edges
    count and echo); `start` submits the request to the model's engine with the images'
    placeholder ids and embeddings (`llamay.multimodal.layout`)."""
    from llamay import multimodal

    model = lm.model
    if getattr(model, "projector", None) is None:
        raise ImageError(
            f"model {lm.name!r} has no vision projector: start the server with "
            "--mmproj FILE (llama-server's flag) to give it images"
        )
    prompt = multimodal.layout(model.tokenizer, model.projector, text, images)
    ids = ImageIds(max(t, 0) for t in prompt.ids)

    async def start(request: Request) -> Handle:
        full = dataclasses.replace(request, prompt_ids=prompt.ids, images=prompt.images)
        return lm.engine.submit(full)

    ids.start, ids.prompt = start, prompt
    return ids, start
