"""One line counting a test run's skips by reason.

tests/conftest.py prints it at the end of every pytest run and, when `$LLAMAY_SKIP_LOG` names
a file, appends the run's counts to it as a JSON line; scripts/run-tests.sh (one pytest
process per file) then runs `python tests/skip_counts.py LOG` for the whole suite's line.
"""

from __future__ import annotations

import collections
import json
import sys


def format_skips(reasons: collections.Counter) -> str:
    if not reasons:
        return "skips by reason: none"
    parts = [f"{n} x {reason}" for reason, n in reasons.most_common()]
    return f"skips by reason ({sum(reasons.values())}): " + "; ".join(parts)


def add_up(lines) -> collections.Counter:
    total = collections.Counter()
    for line in lines:
        if line.strip():
            total.update(json.loads(line))
    return total


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(f"whole suite: {format_skips(add_up(f))}")
