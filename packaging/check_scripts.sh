#!/bin/sh
# Parse-check the install scripts as CI does: sh -n and dash -n (Debian's /bin/sh is dash,
# where a bashism breaks `curl ... | sh`), shellcheck, and PowerShell's parser where pwsh
# exists. Checkers that are not installed are reported and skipped.
#
#   packaging/check_scripts.sh [install.sh ...] [install.ps1 ...]   (default: both of ours)
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -gt 0 ] || set -- "$here/install.sh" "$here/install.ps1" "$here/check_scripts.sh"
failed=0
check() { # name command...
    name=$1
    shift
    if "$@"; then
        echo "ok    $name"
    else
        echo "FAIL  $name" >&2
        failed=1
    fi
}
skip() { echo "skip  $1 ($2 not installed)"; }
for f in "$@"; do
    [ -f "$f" ] || {
        echo "FAIL  $f: no such file" >&2
        failed=1
        continue
    }
    case $f in
    *.sh)
        check "sh -n $f" sh -n "$f"
        if command -v dash >/dev/null 2>&1; then
            check "dash -n $f" dash -n "$f"
        else
            skip "dash -n $f" dash
        fi
        if command -v shellcheck >/dev/null 2>&1; then
            check "shellcheck $f" shellcheck -s sh "$f"
        else
            skip "shellcheck $f" shellcheck
        fi
        ;;
    *.ps1)
        if command -v pwsh >/dev/null 2>&1; then
            check "pwsh parse $f" pwsh -NoProfile -NonInteractive -Command \
                "\$e = \$null; [void][System.Management.Automation.Language.Parser]::ParseFile('$f', [ref]\$null, [ref]\$e); if (\$e) { \$e | ForEach-Object { Write-Error \$_.ToString() }; exit 1 }"
        else
            skip "pwsh parse $f" pwsh
        fi
        ;;
    *)
        echo "FAIL  $f: not a .sh or .ps1 file" >&2
        failed=1
        ;;
    esac
done
exit $failed
