"""Images to the vision tower's input, as llama.cpp's tools/mtmd/mtmd-image.cpp does it.

- Decoding: bytes (PNG, JPEG, WebP, ...), a path, a PIL image or an HxWx3 uint8 array, to
  RGB uint8. (llama.cpp decodes with stb_image; for lossless formats the pixels agree.)
- Resizing: llama.cpp's resampler (Pillow's algorithm: a separable two-pass filter with
  22-bit fixed-point weights, rounded and clipped to 8 bits between the passes; bilinear,
  bicubic a = -0.5, Lanczos-3), in numpy; a side that keeps its size is not resampled.
- Fixed size (gemma3, mlp): letterbox to image_size x image_size (scale = min of the two
  ratios in f32, sides rounded up, the image centred on the pad colour).
- Idefics3 (with `clip.vision.preproc_image_size`): the longest side resized to that size
  (the other side kept to the aspect ratio, truncated, made even), then up to a multiple
  of image_size, cut into image_size tiles (row-major), plus an overview of the whole
  picture at image_size: the tiles first, the overview last, as mtmd lays them out.
- Normalising: x / 255 in f32, then (x - mean) / std per channel.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass

import numpy as np

from llamay.errors import ImageError
from llamay.vision.mmproj import PAD_COLOR, RESIZE, VisionConfig


def _pil():
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - Pillow is in the vision extra
        raise ImageError("images need Pillow: pip install 'llamay[vision]'") from e
    return Image


def decode_image(image) -> np.ndarray:
    """An image (encoded bytes, a path, a PIL image or an HxWx3/HxW uint8 array) as RGB uint8."""
    if isinstance(image, np.ndarray):
        arr = image
        if arr.ndim == 2:
            arr = np.repeat(arr[..., None], 3, axis=-1)
        if arr.ndim != 3 or arr.shape[-1] not in (3, 4) or arr.dtype != np.uint8:
            raise ImageError(f"an image array must be HxWx3 uint8, not {arr.shape} {arr.dtype}")
        if min(arr.shape[:2]) < 1:
            raise ImageError("the image is empty")
        return np.ascontiguousarray(arr[..., :3])
    Image = _pil()
    if isinstance(image, (bytes, bytearray, memoryview)):
        try:
            img = Image.open(io.BytesIO(bytes(image)))
            img.load()
        except Exception as e:
            raise ImageError(
                f"the image bytes cannot be decoded ({type(e).__name__}: {e})"
            ) from None
    elif isinstance(image, (str, os.PathLike)):
        try:
            img = Image.open(image)
            img.load()
        except FileNotFoundError:
            raise ImageError(f"image file not found: {os.fspath(image)}") from None
        except Exception as e:
            raise ImageError(f"{os.fspath(image)}: cannot be decoded as an image ({e})") from None
    elif hasattr(image, "convert") and hasattr(image, "size"):
        img = image
    else:
        raise ImageError(
            "an image must be bytes, a path, a PIL image or a uint8 array, "
            f"not {type(image).__name__}"
        )
    return np.asarray(img.convert("RGB"), dtype=np.uint8)


_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}
_PRECISION_BITS = 22


def _filter(algo: str, x: np.ndarray) -> np.ndarray:
    if algo == "lanczos":

        def sinc(v):
            with np.errstate(all="ignore"):
                return np.where(v == 0.0, 1.0, np.sin(np.pi * v) / (np.pi * v))

        return np.where((x >= -3.0) & (x < 3.0), sinc(x) * sinc(x / 3.0), 0.0)
    x = np.abs(x)
    if algo == "bilinear":
        return np.where(x < 1.0, 1.0 - x, 0.0)
    a = -0.5
    return np.where(
        x < 1.0,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1,
        np.where(x < 2.0, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _weights(in_size: int, out_size: int, algo: str) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel: the first input index and the fixed-point weights over a kernel
    window (Pillow's precompute_coeffs + normalize_coeffs_8bpc, as mtmd-image.cpp has them)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = _SUPPORT[algo] * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    xmins = np.zeros(out_size, np.int64)
    kk = np.zeros((out_size, ksize), np.float64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = _filter(algo, (np.arange(xmax) + xmin - center + 0.5) / filterscale)
        ww = w.sum()
        if ww != 0.0:
            w = w / ww
        kk[xx, :xmax] = w
        xmins[xx] = xmin
    fixed = (kk * (1 << _PRECISION_BITS) + np.where(kk < 0, -0.5, 0.5)).astype(
        np.int64
    )  # truncates
    return xmins, fixed


def _pass(img: np.ndarray, out_size: int, algo: str, axis: int) -> np.ndarray:
    """One separable pass along `axis` (1: horizontal, 0: vertical) of uint8 HxWx3."""
    src = np.moveaxis(img, axis, 0).astype(np.int64)
    n = src.shape[0]
    xmins, fixed = _weights(n, out_size, algo)
    ksize = fixed.shape[1]
    idx = np.minimum(xmins[:, None] + np.arange(ksize)[None], n - 1)  # padded taps have weight 0
    acc = np.einsum("ok,ok...->o...", fixed, src[idx]) + (1 << (_PRECISION_BITS - 1))
    out = np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)
    return np.moveaxis(out, 0, axis)


def resize(img: np.ndarray, width: int, height: int, algo: str) -> np.ndarray:
    """mtmd-image.cpp's resize_pillow: the horizontal pass, then the vertical, each only
    where that side changes, rounded to uint8 between them."""
    if img.shape[1] != width:
        img = _pass(img, width, algo, 1)
    if img.shape[0] != height:
        img = _pass(img, height, algo, 0)
    return np.ascontiguousarray(img)


def letterbox(img: np.ndarray, size: int, algo: str, color: tuple[int, int, int]) -> np.ndarray:
    """img_tool::resize with PAD_CEIL to size x size."""
    h, w = img.shape[:2]
    if (h, w) == (size, size):
        return img
    f32 = np.float32
    scale = min(f32(size) / f32(w), f32(size) / f32(h))
    nw = min(int(math.ceil(f32(w) * scale)), size)
    nh = min(int(math.ceil(f32(h) * scale)), size)
    small = resize(img, nw, nh, algo)
    out = np.empty((size, size, 3), np.uint8)
    out[:] = np.asarray(color, np.uint8)
    ox, oy = (size - nw) // 2, (size - nh) // 2
    out[oy : oy + nh, ox : ox + nw] = small
    return out


def normalize(img: np.ndarray, cfg: VisionConfig) -> np.ndarray:
    x = img.astype(np.float32) / np.float32(255.0)
    return (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)


@dataclass(frozen=True)
class Prepared:
    """One image as the tower sees it: `tiles` (n, S, S, 3) f32, encoded in this order;
    `grid` (cols, rows) of Idefics3's tiles (the last entry of `tiles` is then the overview),
    None for single-tile projectors."""

    tiles: np.ndarray
    grid: tuple[int, int] | None = None


def prepare(image, cfg: VisionConfig) -> Prepared:
    img = decode_image(image)
    algo = RESIZE[cfg.projector]
    s = cfg.image_size
    if cfg.projector == "idefics3" and cfg.longest_edge > 0:
        h, w = img.shape[:2]
        edge = cfg.longest_edge
        aspect = w / h
        if w >= h:
            rw, rh = edge, int(edge / aspect)
            rh += rh % 2
        else:
            rw, rh = int(edge * aspect), edge
            rw += rw % 2
        gx, gy = -(-rw // s), -(-rh // s)
        resized = resize(img, rw, rh, algo)
        refined = resize(resized, gx * s, gy * s, algo)
        overview = resize(refined, s, s, algo)
        tiles = [
            refined[y * s : (y + 1) * s, x * s : (x + 1) * s] for y in range(gy) for x in range(gx)
        ]
        tiles.append(overview)
        return Prepared(np.stack([normalize(t, cfg) for t in tiles]), (gx, gy))
    if cfg.projector == "idefics3":
        raise ImageError(
            "Idefics3 projectors without clip.vision.preproc_image_size are not supported yet"
        )
    return Prepared(normalize(letterbox(img, s, algo, PAD_COLOR[cfg.projector]), cfg)[None])
