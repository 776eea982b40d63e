"""Synthetic text-line images (Pillow) and error rates, for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# common English words: the vocabulary of generated lines and the demo lexicon
WORDS = (
    "the of and to in is was he for it with as his on be at by had are but from or have an "
    "they which one you were her all she there would their we him been has when who will "
    "more no if out so said what up its about into than them can only other new some could "
    "time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used "
    "take three states himself few house use during without again place american around "
    "however home small found thought went say part once general high upon school every "
    "don does got united left number course war until always away something fact though "
    "water less public put think almost hand enough far took head yet government system "
    "better set told nothing night end why called didn eyes find going look asked later "
    "knew point next program city business give group toward young days let room president "
    "side social given present several order national possible rather second face per "
    "among form important often things looked early white case john become large big need "
    "four within felt children along saw best church ever least power development light "
    "thing seemed family interest want members mind country area others done turned"
).split()

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", "/Library/Fonts", "C:/Windows/Fonts")
PREFERRED = (
    "DejaVuSans.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSansCondensed.ttf",
)


def fonts() -> list[Path | None]:
    """Some TrueType fonts of this machine (None stands for Pillow's built-in font)."""
    found: dict[str, Path] = {}
    for d in FONT_DIRS:
        p = Path(d)
        if p.is_dir():
            for f in p.rglob("*.ttf"):
                found.setdefault(f.name, f)
    chosen = [found[n] for n in PREFERRED if n in found]
    return chosen or [None]


def render_line(
    text: str,
    font: Path | None = None,
    size: int = 32,
    *,
    noise: float = 0.0,
    blur: float = 0.0,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """`text` drawn dark on light, padded a little; Gaussian pixel noise of std `noise`
    (0-255 scale) and Gaussian blur of radius `blur`. Returns uint8 RGB [H, W, 3]."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    rng = rng or np.random.default_rng(0)
    f = ImageFont.truetype(str(font), size) if font else ImageFont.load_default(size)
    left, top, right, bottom = f.getbbox(text)
    pad = max(4, size // 4)
    w, h = right - left + 2 * pad, bottom - top + 2 * pad
    bg = int(rng.integers(200, 256))
    fg = int(rng.integers(0, 70))
    im = Image.new("L", (w, h), bg)
    ImageDraw.Draw(im).text((pad - left, pad - top), text, fill=fg, font=f)
    if blur > 0:
        im = im.filter(ImageFilter.GaussianBlur(blur))
    a = np.asarray(im, np.float32)
    if noise > 0:
        a = a + rng.normal(0, noise, a.shape)
    a = np.clip(a, 0, 255).astype(np.uint8)
    return np.repeat(a[:, :, None], 3, axis=2)


def make_lines(
    n: int,
    seed: int = 0,
    *,
    words_per_line=(2, 5),
    noise=(0.0, 0.0),
    blur=(0.0, 0.0),
    sizes=(20, 28, 36, 48),
) -> list[tuple[str, np.ndarray]]:
    """`n` (text, image) pairs of random WORDS in several fonts and sizes, with noise and
    blur drawn uniformly from the given ranges."""
    rng = np.random.default_rng(seed)
    fs = fonts()
    out = []
    for i in range(n):
        k = int(rng.integers(words_per_line[0], words_per_line[1] + 1))
        text = " ".join(rng.choice(WORDS, size=k))
        img = render_line(
            text,
            fs[i % len(fs)],
            int(sizes[i % len(sizes)]),
            noise=float(rng.uniform(*noise)),
            blur=float(rng.uniform(*blur)),
            rng=rng,
        )
        out.append((text, img))
    return out


def edit_distance(a, b) -> int:
    """Levenshtein distance between two sequences."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def error_rates(refs: list[str], hyps: list[str]) -> tuple[float, float]:
    """(CER, WER) over a corpus: total edits / total reference length."""
    ce = sum(edit_distance(r, h) for r, h in zip(refs, hyps, strict=True))
    we = sum(edit_distance(r.split(), h.split()) for r, h in zip(refs, hyps, strict=True))
    return ce / max(1, sum(len(r) for r in refs)), we / max(1, sum(len(r.split()) for r in refs))
