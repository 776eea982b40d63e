#!/usr/bin/env bash
# The test suite, one pytest process per test file.
#
# Why: XLA CPU (jax 0.12) crashes -- a segfault or abort inside backend compile or
# executable deserialisation -- once a process has compiled enough large programs. One
# process over the whole suite crashed in tests/eval after ~1,000 tests (session 2); one
# process over tests/engine crashed deterministically at its ~60th test (the tiny gemma3
# llamacpp-numerics compile), with or without the persistent compile cache, at 3.6 GB RSS
# (no OOM), while each half of tests/engine with that test, the test's own file, and 600
# small programs before the same compile all pass. Until the XLA cause is found, each file
# gets a fresh process (~3 s of start-up each). Extra arguments go to every pytest call
# (make test passes --require-fixtures: a missing fixture or model fails, see
# tests/fixture_data.py). Each file's skips are logged (tests/conftest.py) and added up in
# one line at the end. TEST_LIST=FILE runs only the targets FILE lists, one process a line
# (a test file, or node ids separated by spaces; `#` comments), e.g. the quick suites
# (scripts/test-jax011.sh). TEST_JOBS=N runs N files at once (make test: 2).
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
JOBS=${TEST_JOBS:-1} # test files run at once (each its own process; output lines prefixed)
LLAMAY_SKIP_LOG=$(mktemp)
export LLAMAY_SKIP_LOG
work=$(mktemp -d)
trap 'rm -rf "$LLAMAY_SKIP_LOG" "$work"' EXIT
if [ -n "${TEST_LIST:-}" ]; then grep -v -e '^#' -e '^$' "$TEST_LIST"; else
  find tests -name 'test_*.py' | LC_ALL=C sort; fi >"$work/targets"

# run_targets LIST FAILED: each line of LIST in its own pytest process; failures to FAILED
run_targets() {
  while IFS= read -r target; do
    echo "== $target"
    read -r -a targets <<<"$target" # a TEST_LIST line may name several node ids of one file
    start=$SECONDS
    "$PY" -m pytest -q "${pytest_args[@]}" "${targets[@]}" </dev/null
    rc=$?
    echo "$((SECONDS - start)) $target" >>"$work/times"
    # 5: nothing collected (e.g. a -k filter matched nothing here)
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
      echo "$target (exit $rc)" >>"$2"
    fi
  done <"$1"
}

pytest_args=("$@")
: >"$work/failed"
: >"$work/times"
if [ "$JOBS" -le 1 ]; then
  run_targets "$work/targets" "$work/failed"
else # every JOBS-th file to each job, so the slow directories spread over the jobs
  for ((j = 0; j < JOBS; j++)); do
    awk -v n="$JOBS" -v j="$j" 'NR % n == j' "$work/targets" >"$work/targets.$j"
    run_targets "$work/targets.$j" "$work/failed" 2>&1 | sed -u "s/^/[$j] /" &
  done
  wait
fi
"$PY" tests/skip_counts.py "$LLAMAY_SKIP_LOG"
echo "slowest test files (s):" # where CI's minutes go
sort -rn "$work/times" | head -12 |
  awk '{ f = $2; sub(/::.*/, "", f); print "  " $1 " " f (NF > 2 ? " (" NF - 1 " targets)" : "") }'
if [ -s "$work/failed" ]; then
  sed 's/^/FAILED: /' "$work/failed"
  exit 1
fi
echo "all test files passed"
