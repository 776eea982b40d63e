#!/usr/bin/env bash
# Test-only oracles whose declared dependencies conflict with ours: pyctcdecode pins
# numpy<2 (JAX needs numpy>=2; its code runs fine on 2.x), so it is installed with
# --no-deps, beside what it really imports (pygtrie, and kenlm for the LM checks).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.llamay-oracles
[ -f "$stamp" ] && exit 0
echo "[llamay] installing test oracles (pyctcdecode, kenlm)" >&2
log=.venv/oracles.log
if ! .venv/bin/python -m pip install -q --no-deps pyctcdecode==0.5.0 pygtrie==2.6.2 \
    kenlm==0.3.0 >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "[llamay] installing test oracles failed (full log: $log)" >&2
  exit 1
fi
touch "$stamp"
