#!/usr/bin/env bash
# The quick suites (scripts/jax011-tests.txt) on the oldest jax llamay supports, 0.11.2:
# what jax-mps (the `[metal]` extra) needs and what current CUDA 13 images ship. They run
# in a second venv, .venv-jax011 (created and kept up to date here, like .venv by
# bootstrap.sh), with only the `test-quick` extra; the whole suite runs on the newest jax
# in .venv (make test). Extra arguments go to every pytest call.
set -euo pipefail
cd "$(dirname "$0")/.."
JAX_VERSION=0.11.2
VENV=.venv-jax011
if [ ! -x "$VENV/bin/python" ]; then
  py=$(scripts/find-python.sh)
  echo "[llamay] creating $VENV with $py" >&2
  "$py" -m venv "$VENV"
fi
stamp=$VENV/.llamay-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$0" -nt "$stamp" ]; then
  echo "[llamay] installing llamay with jax $JAX_VERSION into $VENV" >&2
  log=$VENV/install.log
  if ! { "$VENV/bin/python" -m pip install -q --upgrade pip &&
         "$VENV/bin/python" -m pip install -q -e '.[test-quick]' \
           "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "[llamay] installing into $VENV failed (full log: $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
# a venv left with another jax (pip run by hand) would test the wrong thing
"$VENV/bin/python" - "$JAX_VERSION" <<'PY'
import sys
import jax, jaxlib
got = (jax.__version__, jaxlib.__version__)
if got != (sys.argv[1],) * 2:
    sys.exit(f"[llamay] .venv-jax011 has jax/jaxlib {got}, not {sys.argv[1]}: delete it and rerun")
print(f"[llamay] quick suites on jax {jax.__version__}, jaxlib {jaxlib.__version__}", file=sys.stderr)
PY
PY=$VENV/bin/python TEST_LIST=scripts/jax011-tests.txt exec scripts/run-tests.sh "$@"
