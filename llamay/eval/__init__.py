"""Evaluation: perplexity (llama.cpp's method), log-likelihood scoring, lm-eval adapter."""

from llamay.eval.perplexity import PerplexityResult, perplexity
from llamay.eval.scoring import encode_pair, loglikelihood_rolling, rolling_windows, score

__all__ = [
    "PerplexityResult",
    "encode_pair",
    "loglikelihood_rolling",
    "perplexity",
    "rolling_windows",
    "score",
]
