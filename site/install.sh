#!/bin/sh
# Install llamay into an isolated Python environment and put `llamay` on PATH.
#
#   curl -fsSL <site>/install.sh | sh
#   sh packaging/install.sh [--prefix DIR] [--bin-dir DIR] [--python PATH]
#                           [--extra auto|cpu|cuda|cuda13|tpu|metal] [--source SPEC] [--dry-run]
#
# POSIX sh (runs under dash). Finds a Python >= 3.12, creates a virtual environment in the
# prefix (or reuses the one there), installs llamay with pip's configured index -- with the
# `cuda` extra when an NVIDIA driver is present -- links `llamay` into the bin directory and
# says what it did. Environment: LLAMAY_PREFIX, LLAMAY_BIN_DIR, LLAMAY_PYTHON, LLAMAY_EXTRA,
# LLAMAY_SOURCE, LLAMAY_PIP_ARGS (extra arguments for `pip install`, split on spaces).
set -eu

PREFIX=${LLAMAY_PREFIX:-${XDG_DATA_HOME:-${HOME:-}/.local/share}/llamay}
BIN_DIR=${LLAMAY_BIN_DIR:-${HOME:-}/.local/bin}
PYTHON=${LLAMAY_PYTHON:-}
EXTRA=${LLAMAY_EXTRA:-auto}
SOURCE=${LLAMAY_SOURCE:-}
PIP_ARGS=${LLAMAY_PIP_ARGS:-}
DRY_RUN=0

say() { printf '[llamay] %s\n' "$*"; }
die() {
    printf '[llamay] error: %s\n' "$*" >&2
    exit 1
}
run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '[llamay] would run: %s\n' "$*"
    else
        "$@"
    fi
}
usage() {
    sed -n '2,12s/^# \{0,1\}//p' "$0" 2>/dev/null ||
        echo "usage: install.sh [--prefix DIR] [--bin-dir DIR] [--python PATH] [--extra E] [--source SPEC] [--dry-run]"
}
need_arg() {
    [ "$2" -ge 2 ] || die "$1 needs a value"
}

while [ $# -gt 0 ]; do
    case $1 in
    --prefix) need_arg "$1" $# && PREFIX=$2 && shift 2 ;;
    --prefix=*) PREFIX=${1#*=} && shift ;;
    --bin-dir) need_arg "$1" $# && BIN_DIR=$2 && shift 2 ;;
    --bin-dir=*) BIN_DIR=${1#*=} && shift ;;
    --python) need_arg "$1" $# && PYTHON=$2 && shift 2 ;;
    --python=*) PYTHON=${1#*=} && shift ;;
    --extra) need_arg "$1" $# && EXTRA=$2 && shift 2 ;;
    --extra=*) EXTRA=${1#*=} && shift ;;
    --source) need_arg "$1" $# && SOURCE=$2 && shift 2 ;;
    --source=*) SOURCE=${1#*=} && shift ;;
    --dry-run) DRY_RUN=1 && shift ;;
    -h | --help)
        usage
        exit 0
        ;;
    *) die "unknown option '$1' (try --help)" ;;
    esac
done

[ -n "$PREFIX" ] || die "no prefix: set HOME, LLAMAY_PREFIX or --prefix"
[ -n "$BIN_DIR" ] || die "no bin directory: set HOME, LLAMAY_BIN_DIR or --bin-dir"

# -- the system ----------------------------------------------------------------------------
os=$(uname -s 2>/dev/null || echo unknown)
machine=$(uname -m 2>/dev/null || echo unknown)
case $os in
Linux)
    case $machine in
    x86_64 | amd64 | aarch64 | arm64) ;;
    *) die "llamay needs JAX, which has no build for Linux on $machine (supported: x86_64, aarch64)" ;;
    esac
    ;;
Darwin)
    [ "$machine" = arm64 ] ||
        die "llamay needs JAX, which supports macOS only on Apple silicon (arm64), not $machine"
    ;;
MINGW* | MSYS* | CYGWIN* | Windows_NT)
    die "on Windows use packaging/install.ps1 (PowerShell), or WSL2 for a GPU build"
    ;;
*) die "unsupported system '$os' (llamay supports Linux x86_64/aarch64 and macOS arm64)" ;;
esac

# -- Python >= 3.12 with venv ------------------------------------------------------------
py_ok() {
    "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1
}
if [ -n "$PYTHON" ]; then
    py_ok "$PYTHON" || die "--python $PYTHON is not a Python >= 3.12"
else
    for c in python3.12 python3.13 python3.14 python3; do
        p=$(command -v "$c" 2>/dev/null) || continue
        if py_ok "$p"; then
            PYTHON=$p
            break
        fi
    done
    if [ -z "$PYTHON" ] && command -v pyenv >/dev/null 2>&1; then
        for p in "$(pyenv root)"/versions/3.1[2-9]*/bin/python3; do
            if [ -x "$p" ] && py_ok "$p"; then
                PYTHON=$p
                break
            fi
        done
    fi
    [ -n "$PYTHON" ] ||
        die "llamay needs Python >= 3.12 (tried python3.12, python3.13, python3.14, python3 and pyenv); install one, or pass --python PATH"
fi
py_version=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')

# -- what to install ---------------------------------------------------------------------
if [ -z "$SOURCE" ]; then
    SOURCE=llamay
    case $0 in
    */install.sh)
        here=$(cd "$(dirname "$0")/.." 2>/dev/null && pwd) || here=
        if [ -n "$here" ] && [ -f "$here/pyproject.toml" ] &&
            grep -q '^name = "llamay"' "$here/pyproject.toml"; then
            SOURCE=$here
        fi
        ;;
    esac
fi

detected=""
if [ "$EXTRA" = auto ]; then
    EXTRA=cpu
    if [ "$os" = Linux ]; then
        if command -v nvidia-smi >/dev/null 2>&1; then
            EXTRA=cuda
            detected="nvidia-smi found"
        elif [ -e /proc/driver/nvidia/version ]; then
            EXTRA=cuda
            detected="/proc/driver/nvidia/version found"
        fi
    fi
    [ -n "$detected" ] || detected="no NVIDIA driver found"
fi
case $EXTRA in
cpu) req=$SOURCE ;;
cuda | cuda13 | tpu)
    [ "$os" = Linux ] || die "the $EXTRA build of JAX exists only for Linux"
    req="${SOURCE}[$EXTRA]"
    ;;
metal)
    # jax-mps, Apple GPUs (never chosen by auto: the plugin is young, the CPU build is not)
    [ "$os" = Darwin ] || die "the metal extra (jax-mps) exists only for macOS on Apple silicon"
    req="${SOURCE}[metal]"
    ;;
*) die "--extra must be auto, cpu, cuda, cuda13, tpu or metal, not '$EXTRA'" ;;
esac

say "system: $os $machine; Python $py_version ($PYTHON)"
say "backend: $EXTRA${detected:+ ($detected)}"
say "installing: $req into $PREFIX"

# -- the environment -----------------------------------------------------------------------
venv_py=$PREFIX/bin/python
if [ -f "$PREFIX/pyvenv.cfg" ] && [ -x "$venv_py" ]; then
    py_ok "$venv_py" || die "$PREFIX holds an environment with a Python older than 3.12; remove it first"
    say "reusing the environment in $PREFIX"
elif [ -e "$PREFIX" ] && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
    die "$PREFIX exists and is not a Python environment; choose another --prefix or remove it"
else
    "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
        die "$PYTHON cannot create environments (on Debian/Ubuntu: apt-get install python3-venv, or python$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv)"
    run "$PYTHON" -m venv "$PREFIX"
fi

log=$PREFIX/install.log
set -f # LLAMAY_PIP_ARGS is split into words below, never expanded as file names
if [ "$DRY_RUN" = 1 ]; then
    # shellcheck disable=SC2086 # LLAMAY_PIP_ARGS is a list of words on purpose
    run "$venv_py" -m pip install $PIP_ARGS "$req"
else
    # shellcheck disable=SC2086 # LLAMAY_PIP_ARGS is a list of words on purpose
    if ! "$venv_py" -m pip install --disable-pip-version-check $PIP_ARGS "$req" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "pip could not install $req (full log: $log)"
    fi
fi
set +f

# -- on PATH ---------------------------------------------------------------------------------
run mkdir -p "$BIN_DIR"
run ln -sf "$PREFIX/bin/llamay" "$BIN_DIR/llamay"
if [ "$DRY_RUN" = 1 ]; then
    say "dry run: nothing was changed"
    exit 0
fi
"$BIN_DIR/llamay" --help >/dev/null 2>&1 ||
    die "installed, but '$BIN_DIR/llamay --help' fails; see $log"
version=$("$venv_py" -c 'import llamay; print(llamay.__version__)' 2>/dev/null) || version="?"

say "installed llamay $version ($EXTRA) into $PREFIX"
say "linked $BIN_DIR/llamay"
case ":${PATH:-}:" in
*":$BIN_DIR:"*) say "try: llamay generate \"Once upon a time\"" ;;
*)
    say "$BIN_DIR is not on your PATH; add it, e.g. to ~/.profile:"
    say "  export PATH=\"$BIN_DIR:\$PATH\""
    say "then try: llamay generate \"Once upon a time\""
    ;;
esac
say "to remove llamay: rm -r '$PREFIX' '$BIN_DIR/llamay' (models stay in \${LLAMAY_HOME:-~/.llamay})"
