"""A constraint that starts after a trigger: free text (e.g. reasoning) until the
trigger string or token appears, then the inner constraint (e.g. a JSON schema).

The trigger must end on a token boundary: a token that completes the trigger and
carries more text after it is refused (ConstraintError), since that text would escape
the inner constraint. Before the trigger every token is allowed, end of text included.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from llamay.errors import ConstraintError
from llamay.sample.constraint import Constraint, pack_mask


class Triggered:
    def __init__(
        self,
        inner: Constraint,
        pieces: Sequence[bytes],
        trigger: str | None = None,
        trigger_token: int | None = None,
    ):
        if trigger is None and trigger_token is None:
            raise ConstraintError("a triggered constraint needs a trigger string or token")
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self._pieces = pieces
        self._trigger = trigger.encode() if trigger else None
        self._token = trigger_token
        self._text = b""
        self.triggered = False
        self._free = pack_mask(np.ones(self.vocab_size, bool))

    def mask(self) -> np.ndarray:
        return self.inner.mask() if self.triggered else self._free

    def advance(self, token: int) -> None:
        if self.triggered:
            self.inner.advance(token)
            return
        if self._token is not None and int(token) == self._token:
            self.triggered = True
            return
        if self._trigger is not None:
            self._text += self._pieces[int(token)]
            at = self._text.find(self._trigger)
            if at >= 0:
                rest = self._text[at + len(self._trigger) :]
                if rest:
                    raise ConstraintError(
                        f"token {token} runs past the trigger {self._trigger!r} "
                        f"(continues with {rest!r}); the trigger must end a token"
                    )
                self.triggered = True
            else:
                self._text = self._text[-len(self._trigger) :]

    @property
    def done(self) -> bool:
        return self.triggered and self.inner.done

    @property
    def accepting(self) -> bool:
        # Before the trigger the output may end (as llama.cpp's lazy grammars allow);
        # `triggered` then says the constrained part never started.
        return not self.triggered or self.inner.accepting
