"""Draft sources for speculative decoding (`llamay.engine.speculative`).

A draft source proposes, for each decoding row, up to k tokens that likely follow its
tokens so far. Both sources here propose point masses (one token per position, no
distribution), which is what makes verification exact and simple: see
`llamay.engine.speculative`.

- `ngram_draft`: prompt lookup (no second model): the longest recent n-gram that ends
  the sequence is searched for earlier in it (prompt and generated text alike), and the
  tokens that followed it there are proposed. Strong where the output copies its input:
  code edits, summaries, retrieval-augmented answers.
- `ModelDrafter`: a smaller model with the same tokenizer, run greedily over a paged KV
  pool of its own (llama.cpp's `--model-draft`). Its sequences follow the target's: each
  round it rolls back to the tokens the target confirmed (the page tables are host-side:
  rolling back is lowering a count), feeds what it has not seen, then drafts token by
  token while its top probability stays at or above `p_min` (llama.cpp's
  `--draft-p-min`: the token under the threshold is the draft's last).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llamay.arch.decoder import local_layers
from llamay.engine.paged_steps import PAD_POSITION, paged_step
from llamay.engine.planning import MIN_VIEW, native_tables, table_width
from llamay.engine.programs import persistent_jit
from llamay.errors import DraftModelError
from llamay.kv import bucket
from llamay.kv.pages import grow_paged_kv, new_paged_kv
from llamay.kv.sequences import KVManager, SeqKV
from llamay.sample.chain import argmax, unpack_mask

NGRAM_MAX = 4  # the longest suffix n-gram looked up
NGRAM_MIN = 1
LOOKBACK = 8192  # positions searched back from the end


def ngram_draft(
    tokens: list[int], n: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN
) -> list[int]:
    """Up to `n` tokens proposed to follow `tokens`: for the longest suffix of length
    ngram_max..ngram_min found earlier in `tokens` (the latest occurrence), what followed
    it there. [] when no suffix recurs."""
    if n <= 0 or len(tokens) < 2:
        return []
    arr = np.asarray(tokens[-LOOKBACK:], np.int64)
    L = len(arr)
    for g in range(min(ngram_max, L - 1), ngram_min - 1, -1):
        key = arr[L - g :]
        # windows starting at s < L - g (an earlier occurrence, which has a follower)
        win = np.lib.stride_tricks.sliding_window_view(arr[: L - 1], g)
        hits = np.flatnonzero((win == key).all(axis=1))
        hits = hits[hits < L - g]
        if len(hits):
            s = int(hits[-1]) + g
            return arr[s : s + n].tolist()
    return []


def same_vocabulary(target, draft) -> None:
    """Raise DraftModelError unless `draft` tokenises as `target` does (speculation
    compares token ids: both must mean the same text by each id)."""
    tt, dt = target.tokenizer, draft.tokenizer
    if tt.vocab_size != dt.vocab_size:
        raise DraftModelError(
            f"the draft model's vocabulary has {dt.vocab_size} tokens, the target's "
            f"{tt.vocab_size}: a draft model needs the target's tokenizer"
        )
    tp, dp = target.token_pieces(), draft.token_pieces()
    for i in range(tt.vocab_size):
        if tp[i] != dp[i]:
            raise DraftModelError(
                f"the draft model's token {i} is {dp[i]!r}, the target's {tp[i]!r}: a draft "
                "model needs the target's tokenizer"
            )


@persistent_jit  # kept on disk, primed with the draft steps (`llamay.engine.warmup.prime`)
def _greedy(logits, mask=None):
    """(argmax [R], its probability [R]) of logits [R, V], among the tokens packed
    `mask` [R, W] allows (constraints) when given."""
    logits = logits.astype(jnp.float32)
    if mask is not None:
        logits = jnp.where(unpack_mask(mask, logits.shape[-1]), logits, -jnp.inf)
    lp = jax.nn.log_softmax(logits, axis=-1)
    tok = argmax(lp).astype(jnp.int32)  # the sampler's: XLA CPU's argmax is unvectorised
    return tok, jnp.exp(jnp.take_along_axis(lp, tok[:, None], -1)[:, 0])


class ModelDrafter:
    """A draft model's pool and sequences (one per target request), driven from the
    engine's worker thread (see the module docstring)."""

    def __init__(self, model, target, slots: int, page_size: int, chunk: int):
        same_vocabulary(target, model)
        cfg = model.config
        if int(local_layers(cfg).sum()):
            raise DraftModelError(
                "draft models with sliding-window layers are not supported: choose a "
                "draft without them (or --model-draft ngram)"
            )
        self.model, self.cfg, self.weights = model, cfg, model.weights
        self.page_size, self.chunk = page_size, chunk
        n_ctx = min(model.n_ctx, target.n_ctx)
        n_pages = slots * -(-min(n_ctx, 1024) // page_size) + 1
        most = slots * -(-(n_ctx + 64) // page_size) + 1
        self.mgr = KVManager(n_pages, page_size, True, max(n_pages, most), max_feed=chunk)
        self.kv = new_paged_kv(
            cfg.n_layers, n_pages, page_size, cfg.n_kv_heads, cfg.head_dim, model.runtime.kv_dtype
        )
        self.seqs: dict[str, SeqKV] = {}
        self.n_ctx = n_ctx
        self.native = native_tables(cfg, self.kv)  # one table width (`Planner._table_width`)

    def table_width(self, T: int, pages: int) -> int:
        """The page-table width of a draft step (as `Planner._table_width`)."""
        if self.native:
            pages = max(pages, -(-self.n_ctx // self.page_size))
        return table_width(pages, max(1, MIN_VIEW // self.page_size))

    def close(self) -> None:
        for s in self.seqs.values():
            self.mgr.release(s)
        self.seqs.clear()

    def forget(self, live: set[str]) -> None:
        """Release the sequences of requests no longer running."""
        for hid in [h for h in self.seqs if h not in live]:
            self.mgr.release(self.seqs.pop(hid))

    def propose(self, rows: list, p_min: float) -> dict[int, list[int]]:
        """rows: (key, confirmed tokens, k, reserve, constraint or None) each: up to k
        greedy draft tokens per row (by its index in rows), each allowed by the row's
        constraint (advanced over the draft, then rolled back); a row the draft pool
        cannot take drafts nothing."""
        out: dict[int, list[int]] = {j: [] for j in range(len(rows))}
        got: list[tuple[int, SeqKV, int]] = []  # (row, its sequence, k)
        for j, (key, toks, k, reserve, _) in enumerate(rows):
            s = self.seqs.get(key)
            if s is None:
                s = self.mgr.open(list(toks), reserve)
                if s is None:
                    continue  # the draft pool is full for now: no draft for this row
                self.seqs[key] = s
            else:
                n = min(s.n_cached, len(toks))
                common = next((i for i in range(n) if s.tokens[i] != toks[i]), n)
                s.n_cached = common  # roll back to what the target confirmed
                s.tokens = list(toks)
            got.append((j, s, k))
        if not got:
            return out
        cons = {r: rows[j][4] for r, (j, _, _) in enumerate(got) if rows[j][4] is not None}
        advanced = dict.fromkeys(cons, 0)
        try:
            self._draft(got, out, p_min, cons, advanced)
        finally:
            for r, n in advanced.items():
                if n:
                    cons[r].rollback(n)
        return out

    def _draft(self, got, out, p_min, cons, advanced) -> None:
        nxt, prob = np.zeros(len(got), np.int64), np.zeros(len(got))
        # catch up: feed what each has not seen, in chunks; its last chunk's logits draft
        live = list(range(len(got)))
        while live:
            feed = [min(len(got[r][1].pending), self.chunk) for r in live]
            ending = [r for q, r in enumerate(live) if feed[q] == len(got[r][1].pending)]
            masks = self._masks(live, ending, cons)
            tok, p = self._forward([got[r][1] for r in live], feed, masks)
            for q, r in enumerate(live):
                self.mgr.commit(got[r][1], feed[q])
                nxt[r], prob[r] = tok[q], p[q]
            live = [r for r in live if got[r][1].pending]
        drafting = list(range(len(got)))
        while True:
            drafting = [r for r in drafting if prob[r] > 0]  # a constraint allowing nothing
            for r in drafting:
                out[got[r][0]].append(int(nxt[r]))
            drafting = [r for r in drafting if len(out[got[r][0]]) < got[r][2] and prob[r] >= p_min]
            for r in [r for r in drafting if r in cons]:
                cons[r].advance(int(nxt[r]))
                advanced[r] += 1
                if cons[r].done:
                    drafting.remove(r)
            if not drafting:
                return
            for r in drafting:
                got[r][1].tokens.append(int(nxt[r]))
            masks = self._masks(drafting, drafting, cons)
            tok, p = self._forward([got[r][1] for r in drafting], [1] * len(drafting), masks)
            for q, r in enumerate(drafting):
                self.mgr.commit(got[r][1], 1)
                nxt[r], prob[r] = tok[q], p[q]

    @staticmethod
    def _masks(rows: list[int], drawing: list[int], cons: dict):
        """Packed masks [R, W] for a draft step over `rows`: the constraint's mask now for
        those in `drawing` that have one, everything allowed for the others; or None."""
        own = {q: cons[r] for q, r in enumerate(rows) if r in cons and r in drawing}
        if not own:
            return None
        got = {q: np.asarray(c.mask(), np.uint32) for q, c in own.items()}
        W = max(m.shape[-1] for m in got.values())
        out = np.full((bucket(len(rows), 1), W), 0xFFFFFFFF, np.uint32)
        for q, m in got.items():
            out[q] = 0
            out[q, : m.shape[-1]] = m
        return out

    def _forward(self, seqs: list[SeqKV], feed: list[int], masks=None):
        """Feed each seq its next feed[i] pending tokens; (greedy token, its
        probability) after each one's last, on the host."""
        for s, n in zip(seqs, feed, strict=True):
            self.mgr.ensure(s, s.n_cached + n)
        if self.mgr.alloc.n_pages != self.kv.n_pages:
            self.kv = grow_paged_kv(self.kv, self.mgr.alloc.n_pages, 0)
        R = bucket(len(seqs), 1)
        T = 1 if max(feed) <= 1 else bucket(max(feed), 16)
        M = self.table_width(T, max(len(s.pages) for s in seqs))
        tokens = np.zeros((R, T), np.int32)
        positions = np.full((R, T), PAD_POSITION, np.int32)
        table = np.zeros((R, M), np.int32)
        last = np.zeros(R, np.int32)
        for j, (s, n) in enumerate(zip(seqs, feed, strict=True)):
            tokens[j, :n] = s.pending[:n]
            positions[j, :n] = np.arange(s.n_cached, s.n_cached + n)
            table[j, : len(s.pages)] = s.pages
            last[j] = n - 1
        args = jax.device_put((tokens, positions, table, last))
        logits, self.kv = paged_step(self.cfg, self.weights, self.kv, *args)
        mask = None if masks is None else jax.device_put(masks)
        tok, p = jax.device_get(_greedy(logits, mask))
        return tok[: len(seqs)], p[: len(seqs)]
