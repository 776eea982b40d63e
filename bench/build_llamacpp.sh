#!/usr/bin/env bash
# Build the peer the benches compare against (never a llamay dependency), once per machine:
# llama.cpp as vendored in llama-cpp-python 0.3.36's source release, one cmake build that
# gives the benches what they run:
#   ~/.cache/llamay/llama-server/build/bin/llama-server   (bench/llamaserver_compare.py)
#   ~/.cache/llamay/llama-server/build/bin/llama-perplexity (bench/perplexity_compare.py)
#   ~/.cache/llamay/llamacpp-venv with llama_cpp importable (bench/llamacpp_compare.py,
#     tests/quant/test_quant_families_bench.py, tests/quant/test_quant_types_llamacpp.py)
# About 12 min on 2 cores. GGML_NATIVE=ON (the host's ISA), except on CPUs with AMX, where
# ggml's AMX matmul crashed (SIGSEGV at the first prefill, 2026-12-03): there the host's
# AVX-512 features are named one by one, AMX off.
#   bench/build_llamacpp.sh            # PY: a python3.12 for the venv (scripts/find-python.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${LLAMAY_CACHE:-$HOME/.cache/llamay}"
SRC="$ROOT/llama-server"
VENV="$ROOT/llamacpp-venv"
VERSION=0.3.36
PY="${PY:-$(scripts/find-python.sh)}"
mkdir -p "$SRC"
cd "$SRC"
if [ ! -f "llama_cpp_python-$VERSION.tar.gz" ]; then
  "$PY" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
fi
[ -d "llama_cpp_python-$VERSION" ] || tar xzf "llama_cpp_python-$VERSION.tar.gz"

isa=(-DGGML_NATIVE=ON)
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
  for f in avx_vnni:AVX_VNNI avx512f:AVX512 avx512_vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
    avx512_bf16:AVX512_BF16; do
    grep -qw "${f%%:*}" /proc/cpuinfo && isa+=("-DGGML_${f##*:}=ON")
  done
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "llama_cpp_python-$VERSION/vendor/llama.cpp" -B build "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release "${isa[@]}" -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF
nice -n 5 cmake --build build --target llama llama-server llama-perplexity -j"$(nproc)"

# the Python binding over the same shared libraries
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q numpy typing_extensions diskcache jinja2
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
rm -rf "$site/llama_cpp"
cp -r "llama_cpp_python-$VERSION/llama_cpp" "$site/llama_cpp"
mkdir -p "$site/llama_cpp/lib"
cp build/bin/*.so* "$site/llama_cpp/lib/"
"$VENV/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, "ready")'
