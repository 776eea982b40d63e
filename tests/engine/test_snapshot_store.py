"""The done-when test of snapshots, on SmolLM2: a sequence's KV saved into the store
(content-addressed by model digest + token ids + KV dtype), restored into the pool of
a NEW process, continues exactly as the uninterrupted run (greedy)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import llamay
from llamay.engine.api import Request
from llamay.engine.scheduler import BatchEngine, model_digest
from llamay.errors import SnapshotError
from llamay.kv.snapshot import load_snapshot, snapshot_dir, store_snapshot, stored_snapshots
from llamay.sample import GREEDY


@pytest.mark.model
def test_snapshot_in_the_store_restores_in_a_new_process(smollm2_path, tmp_path):
    m = llamay.load(smollm2_path, n_ctx=512)
    prompt = m.tokenize("The three primary colours are", add_special=True, parse_special=True)
    whole = list(m.generation(prompt, 16, GREEDY))
    e = BatchEngine(m, slots=2, page_size=16, n_pages=16)
    try:
        h = e.submit(Request(prompt, 7, GREEDY, keep=True))
        first = [ev.token_id for ev in h]
        snap = e.snapshot(h)
        digest = store_snapshot(snap, root=tmp_path)
        assert store_snapshot(e.snapshot(h), root=tmp_path) == digest  # same content
        e.release(h)
    finally:
        e.close()
    assert len(list(snapshot_dir(tmp_path).iterdir())) == 1
    [listed] = stored_snapshots(model=model_digest(smollm2_path), root=tmp_path)
    assert listed.digest == digest and listed.n_tokens == len(prompt) + len(first)
    assert listed.kv_dtype == "float32" and stored_snapshots(model="sha256:0", root=tmp_path) == []

    code = textwrap.dedent(f"""
        import llamay
        from llamay.engine.api import Request
        from llamay.engine.scheduler import BatchEngine
        from llamay.kv.snapshot import load_snapshot
        from llamay.sample import GREEDY
        m = llamay.load({str(smollm2_path)!r}, n_ctx=512)
        e = BatchEngine(m, slots=2, page_size=16, n_pages=16)
        h = e.restore(load_snapshot({digest!r}), Request([], 9, GREEDY))
        print([ev.token_id for ev in h], h.usage.cached_tokens)
        e.close()
    """)
    env = {**os.environ, "LLAMAY_HOME": str(tmp_path)}  # the store's default root
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rest, cached = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert first + eval(rest) == whole
    assert int(cached) == snap.n_cached  # restored, not recomputed


def test_a_missing_or_malformed_digest_is_a_clear_error(tmp_path):
    with pytest.raises(SnapshotError, match="no stored snapshot"):
        load_snapshot("sha256:" + "ab" * 32, root=tmp_path)
    with pytest.raises(SnapshotError, match="not a snapshot digest"):
        load_snapshot("../../etc/passwd", root=tmp_path)
