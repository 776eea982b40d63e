#!/usr/bin/env bash
# The test suite, one pytest process per test directory (then the top-level files).
#
# Why: in one process over the whole suite, XLA CPU (jax 0.12) segfaulted compiling or
# (de)serialising the 4-device sharded programs of tests/eval/test_eval_sharding.py, after
# ~1,000 earlier tests; the same tests pass in a process of their own or after
# tests/engine. Until that is understood (see the session-2 closing note), each room's
# tests run in a fresh process. Extra arguments go to every pytest call.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
failed=()
for target in tests/*/ tests/test_*.py; do
  echo "== $target"
  "$PY" -m pytest -q "$@" "$target"
  rc=$?
  # 5: nothing collected (e.g. a -k filter matched nothing here)
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    failed+=("$target (exit $rc)")
  fi
done
if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all test directories passed"
