#!/usr/bin/env bash
# Create .venv with a Python >= 3.12 and install llamay (editable) with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  py=$(scripts/find-python.sh)
  echo "[llamay] creating .venv with $py" >&2
  "$py" -m venv .venv
fi
stamp=.venv/.llamay-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "[llamay] installing dependencies into .venv" >&2
  log=.venv/install.log
  if ! { .venv/bin/python -m pip install -q --upgrade pip &&
         .venv/bin/python -m pip install -q -e '.[test]'; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "[llamay] installing dependencies failed (full log: $log)" >&2
    exit 1
  fi
  touch "$stamp"
fi
