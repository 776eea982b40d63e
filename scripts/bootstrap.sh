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
  .venv/bin/python -m pip install -q --upgrade pip >&2
  .venv/bin/python -m pip install -q -e '.[test]' >&2
  touch "$stamp"
fi
