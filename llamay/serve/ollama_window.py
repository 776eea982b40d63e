"""Ollama's context window over one request, and what Ollama does with a prompt that does
not fit it.

The window is `options.num_ctx` (a Modelfile's `PARAMETER num_ctx` too), at most the
context the server loaded the model with: Ollama reloads a model for a larger one, llamay
serves every request from one engine. A prompt that does not fit is truncated, as
Ollama's `truncate` (on by default) does:

- a chat drops its oldest turns until the prompt fits, keeping the system messages, the
  last turn, and the assistant turn that called a tool whose result is kept (Ollama's
  `chatPrompt`, server/prompt.go). It starts at a user turn or such a call, never in
  between, since a chat template may insist that turns alternate;
- a prompt still too long (a generate prompt, or one huge last message) keeps its first
  `num_keep` tokens (Ollama's default 4) and its end (Ollama's runner).

`truncate: false` makes a prompt that does not fit a 400 instead.

A prompt that has to be truncated is cut once, up front, far enough to leave the reply
room: `num_predict` tokens, or at most half the window after the kept tokens. With
`shift: false` the prompt keeps the whole window but one token, as Ollama fills it, and
the reply ends where the window does (done_reason "length").

Ollama shifts the context when a reply reaches the end of the window (`shift`, on by
default): it keeps the first `num_keep` tokens (the whole prompt when negative), drops
half of what follows them, and goes on, up to `num_predict` tokens in all; with no
`num_predict` (or -1), up to ten windows' worth (Ollama's llm/server.go bound on a reply
"running on forever"). Ollama moves the kept keys to their new positions; llamay computes
the shifted context afresh (`TextGen.shift_past`), which the prefix cache makes a prefill
of the tokens past the kept ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamay.serve import tools as T
from llamay.serve.errors import ApiError
from llamay.serve.models import Loaded

#: Ollama's default `num_keep`: the prompt tokens a truncation keeps from the start.
NUM_KEEP = 4
#: The longest prompt text (UTF-8 bytes) tokenised to be truncated; a longer one is a 400
#: before it costs seconds of tokenising.
MAX_TRUNCATED_BYTES = 4 << 20


def _option_int(options: dict[str, Any], key: str) -> int | None:
    v = options.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not float(v).is_integer():
        raise ApiError(400, f"option {key} must be an integer, not {v!r}")
    return int(v)


@dataclass(frozen=True)
class Window:
    """The tokens one request may use (`size`), the prompt tokens a truncation keeps from
    the start (`keep`), the room a truncated prompt leaves the reply (`reserve`), whether
    a prompt may be truncated at all (`truncate`) and a full window shifted (`shift`)."""

    size: int
    keep: int
    reserve: int
    truncate: bool
    shift: bool = True

    @classmethod
    def of(
        cls,
        lm: Loaded,
        options: dict[str, Any],
        num_predict: int | None,
        truncate: bool | None,
        shift: bool | None,
    ) -> Window:
        """The window of a request with these `options` (Ollama's keys), `num_predict`
        (None: no limit) and `truncate`/`shift` (None: Ollama's default, on)."""
        n_ctx = _option_int(options, "num_ctx")
        if n_ctx is not None and n_ctx < 1:
            raise ApiError(400, f"option num_ctx must be positive, not {n_ctx}")
        size = min(n_ctx or lm.model.n_ctx, lm.model.n_ctx)
        if size < 2:  # a prompt token and a reply token
            raise ApiError(400, f"option num_ctx {size} leaves no room for a reply")
        keep = _option_int(options, "num_keep")
        keep = NUM_KEEP if keep is None else keep  # negative: Ollama keeps the whole prompt
        if shift is False:
            reserve = 1
        else:
            half = max(1, (size - max(0, keep)) // 2) if keep < size else 1
            reserve = half if num_predict is None else max(1, min(half, num_predict))
        return cls(size, keep, reserve, truncate is not False, shift is not False)

    @property
    def budget(self) -> int:
        """The most tokens a truncated prompt has."""
        return self.size - self.reserve

    def fits(self, n_prompt: int) -> bool:
        """Whether a prompt of `n_prompt` tokens runs uncut (one token of reply at least)."""
        return n_prompt < self.size

    def _refuse(self, n_prompt: int) -> None:
        if not self.truncate:
            raise ApiError(
                400,
                f"the input length ({n_prompt} tokens) exceeds the context length "
                f"({self.size}); send truncate: true (the default) to truncate it",
            )

    def cut(self, ids: list[int]) -> list[int]:
        """`ids` if they fit; else their first `keep` tokens and their end, `budget` in
        all (Ollama's runner truncation, with the reply's room left)."""
        if self.fits(len(ids)):
            return ids
        self._refuse(len(ids))
        keep = len(ids) if self.keep < 0 else self.keep
        keep = min(keep, self.budget - 1)  # at least one token from the end
        return ids[:keep] + ids[len(ids) - (self.budget - keep) :]

    def max_tokens(self, n_prompt: int, num_predict: int | None) -> int:
        """The reply's limit: `num_predict`, within what the window has left. A prompt with
        images is not truncated: one over the window is a 400."""
        room = self.size - n_prompt
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {n_prompt} tokens (images included, which are not "
                f"truncated); the context window (num_ctx) holds {self.size}",
            )
        return room if num_predict is None else min(num_predict, room)

    def reply_limit(self, num_predict: int | None) -> int:
        """The most tokens a reply that shifts the window may have: `num_predict`, at most
        ten windows (Ollama's bound, for no `num_predict` too)."""
        bound = 10 * self.size
        return bound if num_predict is None else min(num_predict, bound)

    def shifted(self, ids: list[int], n_prompt: int) -> list[int]:
        """A full window's `ids` shifted as Ollama's runner shifts them: the first `keep`
        tokens (the prompt's `n_prompt` when `keep` is negative), then the later half of
        the rest."""
        keep = n_prompt if self.keep < 0 else self.keep
        keep = max(0, min(keep, len(ids) - 2))  # something is dropped
        drop = (len(ids) - keep) // 2
        return ids[:keep] + ids[keep + drop :]

    def chat_ids(self, lm: Loaded, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt of a chat (blocking: run it with `core.off_loop`): all of it if it
        fits, else its system messages and the most recent turns that fit `budget`, else
        the last turn cut."""
        ids = T.chat_ids(lm, messages, tools, max_bytes=self.max_bytes)
        if self.fits(len(ids)):
            return ids
        self._refuse(len(ids))

        def ids_from(start: int) -> list[int]:
            system = [m for m in messages[:start] if m.get("role") == "system"]
            return T.chat_ids(lm, system + messages[start:], tools, max_bytes=self.max_bytes)

        starts = _starts(messages)
        # The prompt shrinks as older messages go: find the oldest start that fits.
        lo, hi, best = 0, len(starts) - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            got = ids_from(starts[mid])
            if len(got) <= self.budget:
                best, hi = got, mid - 1
            else:
                lo = mid + 1
        if best is not None:
            return best
        return self.cut(ids_from(starts[-1]) if starts else ids)

    @property
    def max_bytes(self) -> int | None:
        """The most prompt bytes tokenised to be cut (`encode_prompt`'s `max_bytes`); None
        when the prompt is not truncated."""
        return MAX_TRUNCATED_BYTES if self.truncate else None


def _starts(messages: list[dict]) -> list[int]:
    """Where a truncated chat may start, oldest first: at a user turn (a template may
    insist that turns alternate), or at the assistant turn whose calls the tool results
    there answer, so that a result never goes without its call."""
    out = []
    for i in range(1, len(messages)):
        role = messages[i].get("role")
        if role == "user":
            out.append(i)
        elif role == "tool" and messages[i - 1].get("role") != "tool":
            before = messages[i - 1]
            if before.get("role") == "assistant" and before.get("tool_calls"):
                out.append(i - 1)
    return out
