"""Latency histograms for `/metrics`, per model, in Prometheus's text exposition format:

    llamay_time_to_first_token_seconds   submit -> first token (queue wait and prefill)
    llamay_time_per_output_token_seconds a request's decode time per token after the first
    llamay_request_queue_time_seconds    submit -> an engine slot takes the request

Each is `<name>_bucket{model="...",le="..."}` (cumulative, ending in `le="+Inf"`),
`<name>_sum{model="..."}` and `<name>_count{model="..."}`, as Prometheus histograms are
written (the names vLLM's server uses, with llamay's prefix).
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _label(value: str) -> str:
    """A label value escaped as the exposition format says (backslash, quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


@dataclass
class Histogram:
    name: str
    doc: str
    buckets: tuple[float, ...]
    #: model -> (per-bucket counts, the last the +Inf overflow; sum; count)
    series: dict[str, tuple[list[int], float, int]] = field(default_factory=dict)

    def observe(self, model: str, value: float) -> None:
        counts, total, n = self.series.get(model) or ([0] * (len(self.buckets) + 1), 0.0, 0)
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.series[model] = (counts, total + value, n + 1)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.doc}", f"# TYPE {self.name} histogram"]
        for model, (counts, total, n) in sorted(self.series.items()):
            m = f'model="{_label(model)}"'
            running = 0
            for le, c in zip((*self.buckets, math.inf), counts, strict=True):
                running += c
                lines.append(f'{self.name}_bucket{{{m},le="{_num(le)}"}} {running}')
            lines.append(f"{self.name}_sum{{{m}}} {_num(total)}")
            lines.append(f"{self.name}_count{{{m}}} {n}")
        return lines


class Latency:
    """The server's latency histograms; `record(gen)` when a generation ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = Histogram(
            "llamay_time_to_first_token_seconds",
            "Time from a request's submission to its first token",
            _LATENCY_BUCKETS,
        )
        self.tpot = Histogram(
            "llamay_time_per_output_token_seconds",
            "A request's decode time per output token after the first",
            _TOKEN_BUCKETS,
        )
        self.queue = Histogram(
            "llamay_request_queue_time_seconds",
            "Time a request waited for an engine slot",
            _LATENCY_BUCKETS,
        )

    def record(self, gen) -> None:
        """Observe a finished `TextGen`: its first-token time (when a token came), time
        per later token (when more than one came) and queue wait (when the engine
        reported the admission)."""
        model = gen.lm.name
        handle = gen.handle
        with self._lock:
            if gen.t_first is not None:
                self.ttft.observe(model, gen.t_first - gen.t_start)
                if gen.completion_tokens > 1 and gen.t_end is not None:
                    per = (gen.t_end - gen.t_first) / (gen.completion_tokens - 1)
                    self.tpot.observe(model, per)
            admitted = getattr(handle, "t_admitted", None)
            submitted = getattr(handle, "t_submitted", None)
            if admitted is not None and submitted is not None:
                self.queue.observe(model, max(0.0, admitted - submitted))

    def render(self) -> str:
        with self._lock:
            lines = [*self.ttft.render(), *self.tpot.render(), *self.queue.render()]
        return "\n".join(lines) + "\n"
