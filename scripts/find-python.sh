#!/usr/bin/env bash
# Print the path of a Python >= 3.12 (JAX 0.12 needs it): pyenv's 3.12 (the version
# llamay is tested on), then its newer ones, then python3.12 / python3.13 / python3 on PATH.
set -u
ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
if command -v pyenv >/dev/null 2>&1; then
  root=$(pyenv root)
  for v in $(cd "$root/versions" 2>/dev/null && printf '%s\n' 3.1[2-9]* | sort -V | sort -t. -k2,2n -s); do
    p="$root/versions/$v/bin/python3"
    if [ -x "$p" ] && ok "$p"; then echo "$p"; exit 0; fi
  done
fi
for c in python3.12 python3.13 python3; do
  p=$(command -v "$c" 2>/dev/null) || continue
  if ok "$p"; then echo "$p"; exit 0; fi
done
echo "llamay needs Python >= 3.12 (for JAX 0.12); none found (tried pyenv, python3.12, python3.13, python3)" >&2
exit 1
