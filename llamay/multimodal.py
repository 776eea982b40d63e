"""Images in the token stream: a prompt with `<__media__>` markers laid out as llama.cpp's
mtmd lays it out, for the batching engine.

`chunks(tokenizer, projector, prompt, images)` splits the prompt at mtmd's default marker
`<__media__>` (one per image, in order) and returns the list of chunks mtmd_tokenize makes:
("text", ids) and ("image", `ImageChunk`: embeddings [n, n_text] and placeholder id). Each
text piece is tokenized on its own (special tokens parsed; BOS, where the model adds one, on
the first piece only), and the projector's markers are added around each image as mtmd adds
them:

- gemma3: `<start_of_image>` before and `<end_of_image>` after, as text;
- mlp (LLaVA): nothing;
- idefics3 (SmolVLM): per tile `<fake_token_around_image><row_Y_col_X>` (text), the tile,
  a newline after each row but the last, then the ids of `\\n\\n`,
  `<fake_token_around_image>`, `<global-img>`, the overview, `<fake_token_around_image>`.

`layout(...)` flattens them into what an engine `Request` carries: the prompt ids, with each
image chunk's positions holding its placeholder id (negative, derived from the image's
content hash and the chunk's index, as llama.cpp's server and vLLM key image positions: the
prefix tree then reuses an image's K/V for the same image only), and one `ImageSpan` per
image chunk (its embeddings, fed in place of those positions' token embeddings). gemma3's
image chunks attend non-causally (every image token sees the whole image:
`mtmd_decode_use_non_causal`), each fed as a step of its own, as
`mtmd_helper_eval_chunks` decodes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from llamay.engine.api import ImageSpan
from llamay.errors import ImageError
from llamay.vision import MEDIA_MARKER, ImageEmbedding, Projector

NON_CAUSAL = frozenset({"gemma3"})  # mtmd_decode_use_non_causal


def _lookup(tokenizer, text: str) -> int:
    """The token whose text is `text` (mtmd's lookup_token compares decoded pieces, so a
    byte-level vocabulary's `Ċ` is "\n")."""
    tid = tokenizer.token_to_id(text)
    if tid is None:
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        if len(ids) == 1 and tokenizer.decode(ids) == text:
            tid = ids[0]
    if tid is None:
        raise ImageError(
            f"the model's vocabulary lacks {text!r}, which the idefics3 projector's image "
            "layout needs (is this mmproj file for this model?)"
        )
    return tid


@dataclass(frozen=True)
class ImageChunk:
    """One image chunk of a prompt: its embeddings [n, n_text] and its placeholder id."""

    embeddings: np.ndarray
    key: int

    def __len__(self) -> int:
        return len(self.embeddings)


def placeholder(digest: str, index: int) -> int:
    """The placeholder id of chunk `index` of the image whose content hash is `digest`: a
    negative int32 (never a token id), the same for the same image, another for another."""
    h = hashlib.sha256(f"{digest}:{index}".encode()).digest()
    return -1 - int.from_bytes(h[:4], "little") % (2**31 - 1)


def chunks(tokenizer, projector: Projector, prompt: str, images) -> list[tuple[str, object]]:
    parts = prompt.split(MEDIA_MARKER)
    images = list(images)
    if len(parts) - 1 != len(images):
        raise ImageError(
            f"the prompt has {len(parts) - 1} {MEDIA_MARKER} markers for {len(images)} images "
            f"(each image goes where one {MEDIA_MARKER} is)"
        )
    out: list[tuple[str, object]] = []
    first = [True]

    def text(s: str) -> None:
        ids = tokenizer.encode(s, add_special=first[0], parse_special=True)
        first[0] = False
        if ids:
            out.append(("text", list(ids)))

    def ids(toks: list[int]) -> None:
        first[0] = False
        out.append(("text", list(toks)))

    kind = projector.kind
    for i, part in enumerate(parts):
        text(part)
        if i == len(images):
            break
        emb: ImageEmbedding = projector.embed(images[i])

        def image(k: int, emb=emb) -> None:
            out.append(("image", ImageChunk(emb.chunks[k], placeholder(emb.digest, k))))

        if kind == "gemma3":
            text("<start_of_image>")
            image(0)
            text("<end_of_image>")
        elif kind == "idefics3":
            gx, gy = emb.grid
            for y in range(gy):
                for x in range(gx):
                    text(f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>")
                    image(y * gx + x)
                if y != gy - 1:
                    ids([_lookup(tokenizer, "\n")])
            fake = _lookup(tokenizer, "<fake_token_around_image>")
            ids([_lookup(tokenizer, "\n\n"), fake, _lookup(tokenizer, "<global-img>")])
            image(len(emb.chunks) - 1)
            ids([fake])
        else:
            for k in range(len(emb.chunks)):
                image(k)
    return out


def n_positions(chs) -> int:
    return sum(len(c) for _, c in chs)


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with images as an engine `Request` takes it: `ids` (each image chunk's
    positions holding its placeholder id) and `images` (its `ImageSpan`s)."""

    ids: list[int]
    images: tuple[ImageSpan, ...]


def layout(tokenizer, projector: Projector, prompt: str, images) -> ImagePrompt:
    """`chunks`, flattened into an `ImagePrompt`."""
    bidirectional = projector.kind in NON_CAUSAL
    ids: list[int] = []
    spans = []
    for kind, c in chunks(tokenizer, projector, prompt, images):
        if kind == "text":
            ids += c
        else:
            spans.append(ImageSpan(len(ids), c.embeddings, bidirectional))
            ids += [c.key] * len(c)
    return ImagePrompt(ids, tuple(spans))
