"""The worker thread of `BatchEngine`: it alone touches the device state. Each
iteration takes the commands that arrived (submits, cancels, fork/snapshot/restore
calls), admits waiting requests, and runs one step: a decode step for the slots
decoding and a prefill step for those with a prompt chunk to feed. While every slot
decodes and nothing waits, the next step is dispatched before this one is read back;
with `decode_steps` > 1 that dispatch runs several decode steps in one program
(`paged_decode`) when every row can take them (`StepWorker._decode_steps`).
"""

from __future__ import annotations

import dataclasses
import queue
import time

import jax
import numpy as np

from llamay.engine.adapters import row_weights
from llamay.engine.paged_steps import paged_decode, paged_sample, paged_step
from llamay.engine.planning import Active, Plan, RequestFailed
from llamay.kv.pages import grow_paged_kv
from llamay.sample import read_logprobs

GATHER_MAX_S = 0.25  # the longest an idle engine waits to gather a burst (`gather_s`)


class StepWorker:
    """`BatchEngine`'s worker loop and step execution (a mixin over its state)."""

    def _run(self) -> None:
        while True:
            idle = not self.waiting and all(a is None for a in self.slots)
            try:
                cmds = [self._inbox.get()] if idle else []
                while True:
                    cmds.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            if idle and self.gather_s > 0 and cmds[0][0] == "submit":
                self._gather(cmds)
            for op, arg in cmds:
                if op == "close":
                    self._shutdown()
                    return
                try:
                    self._command(op, arg)
                except Exception as exc:  # a broken command never kills the worker
                    if op == "submit":
                        arg._finish("error", exc)
                    elif op not in ("wake",):
                        arg[0].set_exception(exc)
            try:
                self._reap_cancelled()
                self._admit()
                if any(a is not None for a in self.slots):
                    self._refresh_params()
                    self._step()
            except RequestFailed as failed:  # one request's host work: it fails alone
                self._fail(failed.requests)
            except Exception as exc:  # a step failed: fail every request rather than hang them
                self._fail_all(exc)

    def _gather(self, cmds: list) -> None:
        """Append the commands that keep arriving within `gather_s` of each other, until
        there are requests for every free slot."""
        end = time.monotonic() + GATHER_MAX_S
        free = self.slots.count(None) - len(self.waiting)
        while sum(op == "submit" for op, _ in cmds) < free:
            if (left := end - time.monotonic()) <= 0:
                return
            try:
                cmds.append(self._inbox.get(timeout=min(self.gather_s, left)))
            except queue.Empty:
                return

    def _command(self, op: str, arg) -> None:
        if op == "submit":
            self._enqueue(arg)
        elif op == "wake":
            pass
        else:
            fut, args = arg
            fut.set_result(getattr(self, "_" + op)(*args))

    def _step(self) -> None:
        """One iteration: a decode step for the slots decoding and a prefill step for
        those with a prompt chunk to feed, each over just its rows (packed, the row
        count bucketed). While every slot decodes (and nothing waits), the next step is
        dispatched, fed from this one's tokens on device, before this one is read
        back, so the device works while the host does the bookkeeping."""
        busy = [i for i, a in enumerate(self.slots) if a is not None]
        decode = [i for i in busy if len(self.slots[i].seq.pending) == 1]
        prefill = [i for i in busy if len(self.slots[i].seq.pending) > 1]
        images = [i for i in prefill if self._in_image(self.slots[i])]
        if images:  # bidirectional images' positions: a non-causal step of their own
            plan = self._plan(images)
            self._complete(plan, np.asarray(self._dispatch(plan)))
            prefill = [i for i in prefill if i not in images]
            if not decode and not prefill:
                return
        if decode and self.spec is not None and self._speculate(decode, prefill):
            return  # a verify step over the drafts (`llamay.engine.speculative`)
        plans = [self._plan(g) for g in (decode, prefill) if g]
        outs = [self._dispatch(p) for p in plans]
        if len(plans) == 2 or not decode:
            for p, nxt in zip(plans, outs, strict=True):
                self._complete(p, np.asarray(nxt))
            return
        plan, nxt = plans[0], outs[0]
        while True:
            ahead = None
            if self._steady(plan):
                k = self._decode_steps(plan)
                nxt_plan = self._plan(plan.idx, after=plan, steps=k)
                fed = nxt[:, None] if plan.steps == 1 else plan.carry
                ahead = (nxt_plan, self._dispatch(nxt_plan, fed))
            self._complete(plan, np.asarray(nxt))
            if ahead is None:
                return
            plan, nxt = ahead
            if self._inbox.qsize() or self.waiting:  # let the loop admit and take commands
                self._complete(plan, np.asarray(nxt))
                return

    def _steady(self, plan: Plan) -> bool:
        return (
            plan.tokens.shape[1] == 1
            and self.spec is None  # speculation drafts anew each step
            and not self._inbox.qsize()
            and not self.waiting
            and all(
                self.slots[i] is a
                and a.handle.request.constraint is None
                and a.budget > plan.steps  # a token left after the one(s) in flight
                and not a.handle.cancelled
                for i, a in zip(plan.idx, plan.rows, strict=False)
            )
        )

    def _decode_steps(self, plan: Plan) -> int:
        """Decode steps the next dispatch after steady `plan` may take at once
        (`decode_steps`, else 1): every row has that many tokens of budget left after
        those in flight and asks no log-probabilities (read per step off the sampler
        state), and no sliding-window pool (its tables move with the positions). A
        request arriving meanwhile waits for those steps; tokens past a row's end (a
        stop token) are dropped, as are a cancelled row's."""
        k = self.decode_steps
        if k <= 1 or self.mgr.local is not None:
            return 1
        ok = all(a.budget >= plan.steps + k and a.logprobs is None for a in plan.rows)
        return k if ok else 1

    def _sync_pool(self) -> None:
        """Pad the device pools to the allocators' sizes after an allocator grew."""
        n_local = self.mgr.local.n_pages if self.mgr.local is not None else 0
        if self.mgr.alloc.n_pages != self.kv.n_pages or n_local != self.kv.n_local_pages:
            self.kv = grow_paged_kv(self.kv, self.mgr.alloc.n_pages, n_local)

    def _dispatch(self, plan: Plan, tokens: jax.Array | None = None) -> jax.Array:
        self._sync_pool()
        step, sampling = self._step_inputs(plan, tokens, self._params, self._state)
        if plan.steps > 1:  # [steps, R] tokens (`_decode_steps`)
            got = paged_decode(*self._decode_inputs(plan, step, sampling))
            nxt, plan.carry, self.kv, self._state = got
        else:
            logits, self.kv = paged_step(*step)
            nxt, self._state = paged_sample(logits, *sampling)
        plan.state = self._state
        self.counters["steps"] += 1
        return nxt

    def _step_inputs(self, plan: Plan, tokens, params, state) -> tuple[tuple, tuple]:
        """`paged_step`'s arguments for `plan` (`tokens`: fed from the device instead of
        the plan's), and `paged_sample`'s after the logits; `llamay.engine.warmup`
        compiles the step with them."""
        # device_put: jnp.asarray(ndarray) compiles an identity program per shape (jax 0.12)
        fed, positions, table, last, sampling, slots, local = jax.device_put(
            (
                plan.tokens,
                plan.positions,
                plan.table,
                plan.last,
                plan.sampling,
                plan.slots,
                plan.local,
            )
        )
        fed = fed if tokens is None else tokens
        cfg = self.cfg if plan.causal else dataclasses.replace(self.cfg, causal=False)
        step = (
            cfg,
            row_weights(self.weights, plan.lora),  # each row's LoRA scales, if any
            self.kv,
            fed,
            positions,
            table,
            last,
            *(local or (None, None)),
            None if plan.embeds is None else jax.device_put(plan.embeds),
        )
        return step, (sampling, slots, params, state, plan.mask)

    @staticmethod
    def _decode_inputs(plan: Plan, step: tuple, sampling: tuple) -> tuple:
        """`paged_decode`'s arguments from a decode plan's `_step_inputs`."""
        cfg, weights, kv, fed, positions, table = step[:6]
        rows, slots, params, state, _ = sampling
        return cfg, plan.steps, weights, kv, fed, positions, table, rows, slots, params, state

    def _logprobs(self, plan: Plan) -> dict[int, tuple]:
        """{row: (logprob, [(id, logprob)...])} of the plan's sampling rows that asked for
        log-probabilities, read off the step's sampler state in one copy."""
        want = [
            j
            for j, a in enumerate(plan.rows)
            if plan.sampling[j] and a.logprobs is not None and self.slots[plan.idx[j]] is a
        ]
        if not want:
            return {}
        got = read_logprobs(
            plan.state, [plan.idx[j] for j in want], [plan.rows[j].logprobs for j in want]
        )
        return dict(zip(want, got, strict=True))

    def _complete(self, plan: Plan, nxt: np.ndarray) -> None:
        """Commit a finished step (each of a multi-step dispatch's in turn): positions
        fed, tokens sampled, requests ended."""
        if plan.steps > 1:
            for row in nxt:
                self._complete_one(plan, row)
        else:
            self._complete_one(plan, nxt)

    def _complete_one(self, plan: Plan, nxt: np.ndarray) -> None:
        logprobs = self._logprobs(plan)
        for j, (i, a) in enumerate(zip(plan.idx, plan.rows, strict=True)):
            if self.slots[i] is not a:
                continue  # ended while this step was in flight: its result is moot
            self.counters["computed_tokens"] += plan.feed[j]
            with self._lock:
                self.mgr.commit(a.seq, plan.feed[j])
            if not plan.sampling[j]:
                continue
            if not a.prompt_cached:
                a.prompt_cached = True
                with self._lock:
                    self.mgr.cache(a.seq)
            if a.budget <= 0:  # prefill-only (max_tokens=0, keep=True): the KV is the point
                self.slots[i] = None
                self._end(a, "length")
                continue
            self._take(i, a, int(nxt[j]), logprobs.get(j, (None, ())))

    def _take(self, i: int, a: Active, tok: int, logprobs: tuple = (None, ())) -> bool:
        """Emit one sampled token of slot i's request: stop, constraint, budget and
        context ends applied. False when it ended the request."""
        con = a.handle.request.constraint
        if tok in a.stop_ids and (con is None or con.accepting):
            a.handle.stop_token = (tok, *logprobs)
            self.slots[i] = None
            self._end(a, "stop")
            return False
        if con is not None:
            try:
                con.advance(tok)
            except Exception as exc:
                self.slots[i] = None
                self._end(a, "error", exc)
                return False
        a.seq.tokens.append(tok)
        a.budget -= 1
        a.handle._emit(tok, *logprobs)
        if con is not None and con.done:
            self.slots[i] = None
            self._end(a, "stop")
            return False
        if a.budget <= 0 or len(a.seq.tokens) >= self.n_ctx:
            self.slots[i] = None
            self._end(a, "length")
            return False
        return True
