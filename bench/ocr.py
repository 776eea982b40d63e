"""OCR benchmark: CER/WER of greedy vs (soft and hard) lexicon beam search on Pillow-rendered lines
(clean and noisy), and throughput (lines/s) of the JAX recognizer and of each decoder.

    python bench/ocr.py [--lines 64] [--seed 1] [--beam 16]

Prints one JSON object per set. Compilation is excluded (a warm-up pass compiles every
width bucket and batch size first).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from llamay.ocr.ctc import greedy_decode
from llamay.ocr.ppocr import Recognizer
from llamay.ocr.synth import WORDS, error_rates, make_lines
from llamay.ocr.word_beam import WordScorer, beam_search


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--beam", type=int, default=16)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    import jax

    rec = Recognizer.load(args.model)
    sets = {
        "clean": {},
        "noisy": dict(noise=(20, 60), blur=(0.5, 1.5)),
    }
    for name, kw in sets.items():
        lines = make_lines(args.lines, seed=args.seed, **kw)
        refs = [t for t, _ in lines]
        imgs = [im for _, im in lines]
        rec.probs(imgs)  # warm-up: compile every bucket / batch size used below
        t0 = time.perf_counter()
        probs = rec.probs(imgs)
        t_fwd = time.perf_counter() - t0
        logps = [np.log(np.clip(p, 1e-15, 1.0)).astype(np.float64) for p in probs]
        t0 = time.perf_counter()
        greedy = [greedy_decode(lp, rec.alphabet).text for lp in logps]
        t_greedy = time.perf_counter() - t0
        scorer = WordScorer(lexicon=WORDS, alpha=0.0, beta=0.0)
        t0 = time.perf_counter()
        beam = [
            beam_search(lp, rec.alphabet, scorer, beam_width=args.beam, token_min_logp=-8.0)[0].text
            for lp in logps
        ]
        t_beam = time.perf_counter() - t0
        hard = WordScorer(lexicon=WORDS, hard=True)
        hard_text = [
            beam_search(lp, rec.alphabet, hard, beam_width=args.beam, token_min_logp=-8.0)
            for lp in logps
        ]
        hard_text = [b[0].text if b else "" for b in hard_text]
        g_cer, g_wer = error_rates(refs, greedy)
        l_cer, l_wer = error_rates(refs, beam)
        h_cer, h_wer = error_rates(refs, hard_text)
        n = len(lines)
        print(
            json.dumps(
                {
                    "set": name,
                    "lines": n,
                    "backend": jax.default_backend(),
                    "greedy_cer": round(g_cer, 4),
                    "greedy_wer": round(g_wer, 4),
                    "lexicon_cer": round(l_cer, 4),
                    "lexicon_wer": round(l_wer, 4),
                    "hard_lexicon_cer": round(h_cer, 4),
                    "hard_lexicon_wer": round(h_wer, 4),
                    "recognizer_lines_per_s": round(n / t_fwd, 1),
                    "greedy_lines_per_s": round(n / t_greedy, 1),
                    "lexicon_beam_lines_per_s": round(n / t_beam, 1),
                    "end_to_end_greedy_lines_per_s": round(n / (t_fwd + t_greedy), 1),
                    "end_to_end_lexicon_lines_per_s": round(n / (t_fwd + t_beam), 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
