"""The PP-OCRv4 recognizer as a llamay architecture: GGUF conversion, the JAX forward
against onnxruntime (test-only oracle), width buckets without recompiles, and end to end
on Pillow-rendered lines (greedy, and a lexicon beating greedy on noisy lines)."""

from __future__ import annotations

import numpy as np
import pytest
from fixture_data import oracle

from llamay.ocr.ctc import greedy_decode
from llamay.ocr.synth import WORDS, error_rates, make_lines, render_line
from llamay.ocr.word_beam import WordScorer, beam_search

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def rec(ppocr_gguf):
    from llamay.ocr.ppocr import Recognizer

    return Recognizer.load(ppocr_gguf)


@pytest.fixture(scope="module")
def ort_session(ppocr_onnx):
    ort = oracle("onnxruntime")
    return ort.InferenceSession(str(ppocr_onnx), providers=["CPUExecutionProvider"])


def test_gguf_metadata(ppocr_gguf):
    from llamay.gguf.reader import GGUFFile

    with GGUFFile(ppocr_gguf) as f:
        assert f.architecture == "ppocr_rec"
        labels = f.metadata["ppocr.labels"]
        assert len(labels) == 6625 and labels[0] == "" and labels[-1] == " "
        assert f.metadata["ppocr.neck.head_count"] == 8
        assert f.tensors["head.weight"].shape == (120, 6625)


def test_forward_matches_onnxruntime(rec, ort_session):
    from llamay.ocr.ppocr import preprocess

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 48, 160, 3)).astype(np.float32)
    line = preprocess(render_line("Hello, world 42", size=30))
    x[1] = 0.0
    x[1, :, : min(160, line.shape[1])] = line[:, :160]
    ours = rec.probs_batch(x)
    ref = ort_session.run(None, {"x": x.transpose(0, 3, 1, 2)})[0]
    assert ours.shape == ref.shape == (2, 20, 6625)
    assert np.abs(ours - ref).max() < 1e-3
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def test_no_recompile_inside_a_bucket(rec):
    # at height 48 the widths stay 200 and 300: both pad to the 320-pixel bucket
    a = np.full((48, 200, 3), 255, np.uint8)
    b = np.full((48, 300, 3), 255, np.uint8)
    rec.probs([a])
    n = rec.compiled_count()
    out = rec.probs([b])
    assert rec.compiled_count() == n
    assert out[0].shape == (40, 6625)


def test_reads_clean_lines(rec):
    lines = make_lines(6, seed=3, sizes=(20, 28, 36))
    out = rec.recognize([im for _, im in lines])
    cer, wer = error_rates([t for t, _ in lines], [o.text for o in out])
    assert cer < 0.05, [(t, o.text) for (t, _), o in zip(lines, out, strict=True)]
    assert all(0.5 < o.confidence <= 1.0 for o in out)


def test_lexicon_beats_greedy_on_noisy_lines(rec):
    lines = make_lines(12, seed=1, noise=(20, 60), blur=(0.5, 1.5), sizes=(20, 28))
    refs = [t for t, _ in lines]
    logps = [np.log(np.clip(p, 1e-15, 1.0)) for p in rec.probs([im for _, im in lines])]
    greedy = [greedy_decode(lp, rec.alphabet).text for lp in logps]
    kw = dict(beam_width=16, token_min_logp=-8.0)
    soft = WordScorer(lexicon=WORDS, alpha=0.0, beta=0.0)
    beam = [beam_search(lp, rec.alphabet, soft, **kw)[0].text for lp in logps]
    g_cer, g_wer = error_rates(refs, greedy)
    l_cer, l_wer = error_rates(refs, beam)
    assert g_wer > 0, "the noisy set should trouble greedy decoding"
    assert l_wer < g_wer and l_cer <= g_cer, (greedy, beam)
    hard = WordScorer(lexicon=WORDS, hard=True)
    for lp in logps[:4]:
        assert set(beam_search(lp, rec.alphabet, hard, **kw)[0].text.split()) <= set(WORDS)


def test_depthwise_implementations_agree(rec, monkeypatch):
    """The CPU path (shifted multiply-adds) against the grouped convolution."""
    import jax

    from llamay.arch import ppocr as arch

    x = np.random.default_rng(1).uniform(-1, 1, (1, 48, 80, 3)).astype(np.float32)
    outs = []
    for mode in ("shift", "conv"):
        monkeypatch.setenv("LLAMAY_OCR_DEPTHWISE", mode)
        fwd = jax.jit(lambda w, x: arch.forward(rec.cfg, w, x))  # a fresh trace per mode
        outs.append(np.asarray(fwd(rec.weights, x)))
    assert np.abs(outs[0] - outs[1]).max() < 1e-4
