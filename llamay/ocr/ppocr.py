"""Running the PP-OCRv4 recognizer: fetch, convert, load, preprocess, recognise.

The model is the `ch_PP-OCRv4_rec_infer.onnx` shipped in the `rapidocr-onnxruntime==1.4.4`
wheel. `fetch_onnx()` downloads that wheel into llamay's wheel cache (never installing
it) and extracts the ONNX file; `default_gguf()` converts it once into
`$LLAMAY_CACHE/ocr/ppocr-v4-rec.gguf`; `Recognizer.load(path)` reads a GGUF and runs
`llamay.arch.ppocr.forward` under `jax.jit`, with image widths padded to a short table
of buckets and batches padded to powers of two, so new line lengths inside a bucket do
not recompile.
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch import ppocr as arch
from llamay.errors import FetchError, OCRError
from llamay.gguf.reader import GGUFFile
from llamay.ocr.ctc import Alphabet, Hypothesis, greedy_decode
from llamay.ocr.word_beam import WordScorer, beam_search

WHEEL = "rapidocr-onnxruntime==1.4.4"
MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
WIDTH_BUCKETS = (160, 320, 480, 640, 960, 1280, 1920, 2560, 3840)
MAX_BATCH = 32


def ocr_cache_dir() -> Path:
    from llamay.store.wheel import cache_dir

    return cache_dir() / "ocr"


def fetch_onnx(progress: bool = False) -> Path:
    """The recognizer's ONNX file, extracted from its (cached or downloaded) wheel."""
    from llamay.store.wheel import find_cached_wheel, pip_download, wheel_cache_dir

    out = ocr_cache_dir() / Path(MEMBER).name
    if out.is_file():
        return out
    wheel = find_cached_wheel(WHEEL)
    if wheel is None:
        pip_download([WHEEL], wheel_cache_dir(), progress=progress)
        wheel = find_cached_wheel(WHEEL)
        if wheel is None:
            raise FetchError(f"{WHEEL} was downloaded but is not in {wheel_cache_dir()}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{wheel} has no readable {MEMBER}: {e}") from None
    os.replace(tmp, out)
    return out


def default_gguf(progress: bool = False) -> Path:
    """The recognizer as GGUF in llamay's cache, converted from the ONNX file on first use."""
    from llamay.ocr.convert import convert_onnx

    out = ocr_cache_dir() / "ppocr-v4-rec.gguf"
    if not out.is_file():
        convert_onnx(fetch_onnx(progress), out)
    return out


def _bucket(width: int) -> int:
    for b in WIDTH_BUCKETS:
        if width <= b:
            return b
    raise OCRError(
        f"a text line {width} pixels wide (at height 48) exceeds the widest bucket "
        f"{WIDTH_BUCKETS[-1]}; split the line"
    )


def load_image(image) -> np.ndarray:
    """A path, PIL image or array -> uint8 RGB array [H, W, 3]."""
    from PIL import Image

    if isinstance(image, str | os.PathLike):
        try:
            with Image.open(image) as im:
                return np.asarray(im.convert("RGB"))
        except OSError as e:
            raise OCRError(f"cannot read image {image}: {e}") from None
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise OCRError(f"expected an [H, W, 3] image, got shape {list(a.shape)}")
    return a[:, :, :3].astype(np.uint8)


def preprocess(image, height: int = 48) -> np.ndarray:
    """RGB line image -> [48, W', 3] float32 BGR (the model was trained on OpenCV's
    channel order), resized to height 48 keeping the aspect ratio, (x/255 - 0.5)/0.5."""
    from PIL import Image

    rgb = load_image(image)
    h, w = rgb.shape[:2]
    if h == 0 or w == 0:
        raise OCRError("empty image")
    new_w = max(1, math.ceil(height * w / h))
    im = Image.fromarray(rgb).resize((new_w, height), Image.BILINEAR)
    x = np.asarray(im, np.float32)[:, :, ::-1] / 255.0
    return (x - 0.5) / 0.5


@dataclass
class Line:
    text: str
    confidence: float
    hypothesis: Hypothesis


class Recognizer:
    """The PP-OCRv4 recognizer bound to its weights; `probs()` and `recognize()`."""

    def __init__(self, cfg: arch.Config, weights: dict, alphabet: Alphabet):
        self.cfg = cfg
        self.weights = weights
        self.alphabet = alphabet
        self._fwd = jax.jit(arch.forward, static_argnums=0)

    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> Recognizer:
        from llamay.runtime import enable_compilation_cache

        enable_compilation_cache()
        path = default_gguf() if path is None else Path(path)
        with GGUFFile(path) as f:
            if f.architecture != arch_name():
                raise OCRError(f"{path}: architecture {f.architecture!r}, expected {arch_name()!r}")
            tensors = {}
            for name, info in f.tensors.items():
                raw = f.raw(name)
                tensors[name] = np.frombuffer(raw.tobytes(), np.float32).reshape(info.shape)
            labels = list(f.metadata["ppocr.labels"])
            cfg = arch.config(f.metadata, n_classes=len(labels))
            blank = int(f.metadata.get("ppocr.blank", 0))
        return cls(cfg, arch.prepare_weights(cfg, tensors), Alphabet(tuple(labels), blank))

    def compiled_count(self) -> int:
        """How many shapes the forward has been compiled for (for no-recompile tests)."""
        return self._fwd._cache_size()

    def probs_batch(self, batch: np.ndarray) -> np.ndarray:
        """[N, 48, W, 3] normalised images (W a multiple of 8) -> [N, W/8, C] probs."""
        return np.asarray(self._fwd(self.cfg, self.weights, jnp.asarray(batch, jnp.float32)))

    def probs(self, images: Sequence) -> list[np.ndarray]:
        """Per image `[T, C]` probabilities, T = bucket width / 8 (padding frames included)."""
        pre = [preprocess(im, self.cfg.image_height) for im in images]
        out: list[np.ndarray | None] = [None] * len(pre)
        order = sorted(range(len(pre)), key=lambda i: pre[i].shape[1])
        groups: dict[int, list[int]] = {}
        for i in order:
            groups.setdefault(_bucket(pre[i].shape[1]), []).append(i)
        for width, idx in groups.items():
            for s in range(0, len(idx), MAX_BATCH):
                chunk = idx[s : s + MAX_BATCH]
                n = 1 << (len(chunk) - 1).bit_length()
                batch = np.zeros((n, self.cfg.image_height, width, 3), np.float32)
                for j, i in enumerate(chunk):
                    batch[j, :, : pre[i].shape[1]] = pre[i]
                p = self.probs_batch(batch)
                for j, i in enumerate(chunk):
                    out[i] = p[j]
        return out  # type: ignore[return-value]

    def recognize(
        self,
        images: Sequence,
        scorer: WordScorer | None = None,
        beam_width: int = 0,
        **beam_kw,
    ) -> list[Line]:
        """Text lines: greedy decoding by default; word beam search when `beam_width` > 0
        or a scorer (lexicon / LM / hotwords) is given."""
        lines = []
        for p in self.probs(images):
            logp = np.log(np.clip(p, 1e-15, 1.0)).astype(np.float64)
            if scorer is None and beam_width <= 0:
                hyp = greedy_decode(logp, self.alphabet)
            else:
                beams = beam_search(
                    logp, self.alphabet, scorer, beam_width=beam_width or 32, **beam_kw
                )
                hyp = beams[0] if beams else Hypothesis("", [], -math.inf, -math.inf)
            lines.append(Line(hyp.text, _line_confidence(p, self.alphabet.blank), hyp))
        return lines


def _line_confidence(p: np.ndarray, blank: int) -> float:
    """Mean best-class probability over the frames that emit a character (as rapidocr)."""
    best = p.argmax(-1)
    prev = np.concatenate([[-1], best[:-1]])
    keep = (best != blank) & (best != prev)
    if not keep.any():
        return 0.0
    return float(p.max(-1)[keep].mean())


def arch_name() -> str:
    from llamay.ocr.convert import ARCH

    return ARCH
