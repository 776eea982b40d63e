"""OCR: CTC decoders (greedy, prefix beam, word beam with lexicon / ARPA LM / hotwords)
and the PP-OCRv4 text-line recognizer as a JAX architecture (`llamay.ocr.ppocr`)."""

from llamay.ocr.ctc import (
    Alphabet,
    Hypothesis,
    Word,
    greedy_decode,
    log_probs,
    prefix_beam_search,
)
from llamay.ocr.lm import ArpaLM
from llamay.ocr.word_beam import WordScorer, beam_search

__all__ = [
    "Alphabet",
    "ArpaLM",
    "Hypothesis",
    "Word",
    "WordScorer",
    "beam_search",
    "greedy_decode",
    "log_probs",
    "prefix_beam_search",
]
