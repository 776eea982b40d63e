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
# (scripts/test-jax011.sh). TEST_JOBS=N runs N files at once (make test: 2): each job
# takes the next target from one queue, slowest first by the times of the last run (kept
# in $LLAMAY_CACHE/test-times, default ~/.cache/llamay; targets never timed go first), so
# that no job is left running a long file after the others are done.
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
TIMES=${LLAMAY_CACHE:-$HOME/.cache/llamay}/test-times # "seconds target" a line
mkdir -p "$(dirname "$TIMES")" 2>/dev/null
if ! cp "$TIMES" "$work/times.last" 2>/dev/null; then : >"$work/times.last"; fi
# the queue: each target with its last time (none: first), longest first; stable sort
awk 'FILENAME == ARGV[1] { t = $1; sub(/^[^ ]+ /, ""); last[$0] = t; next }
     { print ($0 in last ? last[$0] : 1e9) "\t" $0 }' "$work/times.last" "$work/targets" |
  sort -t $'\t' -k1,1gr -s | cut -f2- >"$work/queue"
if [ "$(wc -l <"$work/queue")" -ne "$(wc -l <"$work/targets")" ]; then
  echo "run-tests.sh: the queue lost targets" >&2
  exit 1
fi

# next_target: the queue's first line, removed from it (the jobs share the queue: a
# mkdir lock, which every platform has, unlike flock on macOS)
next_target() {
  until mkdir "$work/queue.lock" 2>/dev/null; do sleep 0.05; done
  head -n 1 "$work/queue"
  tail -n +2 "$work/queue" >"$work/queue.rest" && mv "$work/queue.rest" "$work/queue"
  rmdir "$work/queue.lock"
}

# run_targets FAILED: targets off the queue, each in its own pytest process, until it is
# empty; failures to FAILED
run_targets() {
  while target=$(next_target) && [ -n "$target" ]; do
    echo "== $target"
    read -r -a targets <<<"$target" # a TEST_LIST line may name several node ids of one file
    start=$SECONDS
    log=$(mktemp "$work/log.XXXXXX")
    "$PY" -m pytest -q "${pytest_args[@]}" "${targets[@]}" </dev/null 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    echo "$((SECONDS - start)) $target" >>"$work/times"
    # 5: nothing collected (e.g. a -k filter matched nothing here)
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
      echo "$target (exit $rc)" >>"$1"
      # kept for the end of the run: a CI log is often read from its tail only
      { echo "==== $target (exit $rc): its last 150 lines of output"; tail -n 150 "$log"; } \
        >>"$work/failed.logs"
    fi
    rm -f "$log"
  done
}

pytest_args=("$@")
: >"$work/failed"
: >"$work/times"
if [ "$JOBS" -le 1 ]; then
  run_targets "$work/failed"
else
  for ((j = 0; j < JOBS; j++)); do
    run_targets "$work/failed" 2>&1 | sed -u "s/^/[$j] /" &
  done
  wait
fi
# this run's times replace the recorded ones of the same targets (kept for the next run)
awk 'FILENAME == ARGV[1] { k = $0; sub(/^[^ ]+ /, "", k); now[k] = 1; next }
     { k = $0; sub(/^[^ ]+ /, "", k); if (!(k in now)) print }' "$work/times" "$work/times.last" \
  >"$work/times.all" && cat "$work/times" >>"$work/times.all" &&
  cp "$work/times.all" "$TIMES" 2>/dev/null
"$PY" tests/skip_counts.py "$LLAMAY_SKIP_LOG"
echo "slowest test files (s):" # where CI's minutes go
sort -rn "$work/times" | head -12 |
  awk '{ f = $2; sub(/::.*/, "", f); print "  " $1 " " f (NF > 2 ? " (" NF - 1 " targets)" : "") }'
if [ -s "$work/failed" ]; then
  cat "$work/failed.logs"
  sed 's/^/FAILED: /' "$work/failed"
  exit 1
fi
echo "all test files passed"
