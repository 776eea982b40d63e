"""Vision: multimodal projector (mmproj) files, image preprocessing and the vision tower.

`Projector.load(path)` reads an mmproj GGUF as llama.cpp's mtmd does (`clip.*` metadata,
`v.*` tower and `mm.*` projector tensors); `Projector.embed(image)` returns the image's
embeddings in the text model's width, one (tokens, n_text) array per image chunk in the
order mtmd places them in the prompt. The tower is `encoder.encode`, a pure function of
(config, weights, pixels), jitted once per tile batch size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from llamay.errors import ProjectorError
from llamay.vision.encoder import encode, encode_jit
from llamay.vision.mmproj import PROJECTORS, VisionConfig, read_mmproj
from llamay.vision.preprocess import Prepared, decode_image, prepare

MEDIA_MARKER = "<__media__>"  # mtmd_default_marker()

__all__ = [
    "MEDIA_MARKER",
    "PROJECTORS",
    "ImageEmbedding",
    "Prepared",
    "Projector",
    "VisionConfig",
    "decode_image",
    "encode",
    "prepare",
    "read_mmproj",
]


@dataclass(frozen=True)
class ImageEmbedding:
    """One image's embeddings: `chunks`, each (tokens, n_text) f32, in prompt order;
    `grid` (cols, rows) of Idefics3 tiles (chunks are the tiles, then the overview);
    `digest`: sha256 of the decoded RGB pixels and their shape (the prefix-cache key)."""

    chunks: tuple[np.ndarray, ...]
    grid: tuple[int, int] | None
    digest: str

    @property
    def n_tokens(self) -> int:
        return sum(len(c) for c in self.chunks)


@dataclass
class Projector:
    cfg: VisionConfig
    weights: dict
    path: str = ""
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike, numerics: str = "exact") -> Projector:
        """`numerics` "llamacpp": the tower computes every f32 operation as ggml's CPU
        backend does (its matmul kernels' summation orders, layer norm, softmax), so its
        f16 GELU lookups see llama.cpp's inputs; "exact": f32 math (with ggml's f16
        roundings), faster."""
        if numerics not in ("exact", "llamacpp"):
            raise ProjectorError(f"numerics must be 'exact' or 'llamacpp', not {numerics!r}")
        cfg, w = read_mmproj(path)
        cfg = dataclasses.replace(cfg, numerics=numerics)
        return cls(cfg, {k: jnp.asarray(v) for k, v in w.items()}, os.fspath(path))

    @property
    def kind(self) -> str:
        return self.cfg.projector

    def embed(self, image) -> ImageEmbedding:
        rgb = decode_image(image)
        digest = hashlib.sha256(repr(rgb.shape).encode() + rgb.tobytes()).hexdigest()
        hit = self._cache.get(digest)
        if hit is not None:
            return hit
        prep = prepare(rgb, self.cfg)
        out = np.asarray(encode_jit(self.cfg, self.weights, jnp.asarray(prep.tiles)))
        emb = ImageEmbedding(tuple(out[i] for i in range(len(out))), prep.grid, digest)
        if len(self._cache) > 64:
            self._cache.pop(next(iter(self._cache)))
        self._cache[digest] = emb
        return emb
