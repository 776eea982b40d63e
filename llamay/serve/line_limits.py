"""llama-server's line limits on a completion, for code completion (`/infill`, editors):

- `n_indent`: every line after the first one the completion starts must be indented by
  at least that many spaces or tabs; the first line that is not (once it shows a character
  other than whitespace) ends the completion, cut where its indentation ends;
- `t_max_predict_ms`: once that much time has passed since the first token, the
  completion ends after its next newline.

Both end the completion as its budget does (finish "length", llama-server's stop type
"limit"). llama-server checks the indentation a token or two late and so may generate
more tokens than it keeps; here the check runs on each piece of text before it is sent,
so the text is the same and no more is sent or generated.
"""

from __future__ import annotations

import time


class LineLimits:
    def __init__(self, n_indent: int = 0, t_max_predict_ms: float = 0.0):
        self.n_indent = n_indent
        self.t_max = t_max_predict_ms / 1e3 if t_max_predict_ms > 0 else None
        self.in_later_line = False  # past the completion's first newline
        self.indent = 0  # the current line's leading spaces and tabs so far
        self.decided = False  # the current line showed a non-whitespace character

    @property
    def active(self) -> bool:
        return self.n_indent > 0 or self.t_max is not None

    def feed(self, text: str, t_first: float | None) -> tuple[str, bool]:
        """(the part of `text`, the completion's next piece, to keep; whether the
        completion ends with it). `t_first`: when its first token came."""
        if self.n_indent > 0:
            for i, ch in enumerate(text):
                if ch == "\n":
                    self.in_later_line, self.indent, self.decided = True, 0, False
                elif not self.in_later_line or self.decided:
                    continue
                elif ch in " \t":
                    self.indent += 1
                else:
                    self.decided = True
                    if self.indent < self.n_indent:
                        return text[:i], True
        late = t_first is not None and time.perf_counter() - t_first > (self.t_max or 0.0)
        return text, self.t_max is not None and "\n" in text and late
