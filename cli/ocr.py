"""`llamay ocr IMAGE...`: read text lines with the PP-OCRv4 recognizer.

One line image per input. Greedy CTC decoding by default; `--lexicon`, `--lm`,
`--hotword` or `--beam N` switch to the word beam search. Text goes to stdout (one
line per image, or JSON with `--json`); timings go to stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from llamay.errors import LlamayError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ocr(
    images: Annotated[list[Path], typer.Argument(help="Text-line images (one line each).")],
    lexicon: Annotated[
        Path | None, typer.Option("--lexicon", help="A word list, one word per line.")
    ] = None,
    hard: Annotated[bool, typer.Option("--hard", help="Only emit lexicon words.")] = False,
    lm: Annotated[Path | None, typer.Option("--lm", help="A word n-gram LM (ARPA).")] = None,
    alpha: Annotated[float, typer.Option("--alpha", help="LM weight.")] = 0.5,
    beta: Annotated[float, typer.Option("--beta", help="Word insertion bonus.")] = 1.5,
    unk: Annotated[float, typer.Option("--unk", help="Out-of-lexicon penalty (log10).")] = -10.0,
    hotword: Annotated[
        list[str] | None, typer.Option("--hotword", help="A word to favour (repeatable).")
    ] = None,
    hotword_weight: Annotated[
        float,
        typer.Option("--hotword-weight", help="A hotword's score (a share while partly spelled)."),
    ] = 10.0,
    beam: Annotated[int, typer.Option("--beam", min=0, help="Beam width (0: greedy).")] = 0,
    model: Annotated[
        Path | None, typer.Option("--model", "-m", help="A ppocr_rec GGUF (default: fetched).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines with words, spans.")] = False,
) -> None:
    """Read the text in each IMAGE (a single text line) and print it with its confidence."""
    from llamay.ocr.ppocr import Recognizer
    from llamay.ocr.word_beam import WordScorer

    try:
        t0 = time.perf_counter()
        rec = Recognizer.load(model)
        scorer = None
        if lexicon or lm or hotword:
            words = None
            if lexicon:
                try:
                    words = [w for w in lexicon.read_text(encoding="utf-8").split() if w]
                except OSError as e:
                    raise typer.BadParameter(f"cannot read lexicon {lexicon}: {e}") from None
            elif lm:  # as pyctcdecode's build_ctcdecoder: the LM's unigrams are the lexicon
                from llamay.ocr.lm import ArpaLM

                words = ArpaLM(lm).unigrams()
            scorer = WordScorer(
                lexicon=words,
                lm=str(lm) if lm else None,
                alpha=alpha if lm else 0.0,
                beta=beta if lm else 0.0,
                unk_score_offset=unk,
                hard=hard,
                hotwords=hotword,
                hotword_weight=hotword_weight,
            )
        t1 = time.perf_counter()
        lines = rec.recognize(
            [str(p) for p in images], scorer, beam_width=beam, token_min_logp=-8.0
        )
        t2 = time.perf_counter()
    except LlamayError as exc:
        _err(f"error: {exc}")
        raise typer.Exit(code=1) from None
    for path, line in zip(images, lines, strict=True):
        if as_json:
            rec_words = [
                {
                    "text": w.text,
                    "start": w.start,
                    "end": w.end,
                    "confidence": round(w.confidence, 4),
                }
                for w in line.hypothesis.words
            ]
            print(
                json.dumps(
                    {
                        "image": str(path),
                        "text": line.text,
                        "confidence": round(line.confidence, 4),
                        "words": rec_words,
                    },
                    ensure_ascii=False,
                )
            )
        else:
            print(
                f"{line.text}\t{line.confidence:.3f}"
                if len(images) == 1
                else f"{path}\t{line.text}\t{line.confidence:.3f}"
            )
    _err(f"load {t1 - t0:.2f}s, {len(lines)} line(s) in {t2 - t1:.2f}s")


def register(app: typer.Typer) -> None:
    app.command("ocr")(ocr)
