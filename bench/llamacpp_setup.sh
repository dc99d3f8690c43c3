#!/usr/bin/env bash
# Builds llama.cpp's CPU server for the vLLM-vs-llama.cpp benchmark, from the llama.cpp that PyPI's
# llama-cpp-python sdist vendors (PyPI is the one registry here that carries its source). Installs under
# ${CPULLM_LLAMACPP_DIR:-$HOME/.cache/cpullm-operator/llama.cpp-<version>}:
#   bin/llama-server bin/llama-quantize bin/llama-bench   (static, Release, native CPU, no GPU backend)
#   convert_hf_to_gguf.py conversion/ gguf-py/             (the matching HF -> GGUF converter; run it with
#                                                           the vLLM venv's python, which has torch/transformers)
# Idempotent: an existing complete install is kept and nothing is downloaded or built. Prints the install
# directory as its last line.
#
#   bench/llamacpp_setup.sh
#   PYTHON=/path/to/python bench/llamacpp_setup.sh     (the python whose pip downloads the sdist)
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36   # llama-cpp-python on PyPI; its vendor/llama.cpp is what gets built

cache=$HOME/.cache/cpullm-operator
prefix=${CPULLM_LLAMACPP_DIR:-$cache/llama.cpp-$LLAMA_CPP_PYTHON_VERSION}
binaries=(llama-server llama-quantize llama-bench)
die() { echo "llamacpp_setup.sh: $*" >&2; exit 1; }

complete() {
  [[ -f $prefix/.complete && -f $prefix/convert_hf_to_gguf.py && -d $prefix/gguf-py && -d $prefix/conversion ]] \
    || return 1
  local b
  for b in "${binaries[@]}"; do [[ -x $prefix/bin/$b ]] || return 1; done
}

if complete; then
  echo "$prefix"
  exit 0
fi

# pip only downloads here: nothing is installed into either venv.
python=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
[[ -x $python ]] || die "no python with pip at $python: run scripts/setup.sh, or set PYTHON"
command -v cmake >/dev/null || die "cmake is missing (apt-get install cmake g++)"

work=$(mktemp -d "${TMPDIR:-/tmp}/llamacpp-setup.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "llamacpp_setup.sh: downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION's sdist" >&2
PIP_DISABLE_PIP_VERSION_CHECK=1 "$python" -m pip download -q --no-deps --no-binary :all: \
  -d "$work" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
sdist=$(echo "$work"/llama_cpp_python-*.tar.gz)
[[ -f $sdist ]] || die "pip did not leave an sdist in $work"
top=llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION
tar -xzf "$sdist" -C "$work" --wildcards "$top/vendor/llama.cpp/*"
src=$work/$top/vendor/llama.cpp
[[ -f $src/CMakeLists.txt ]] || die "the sdist has no vendor/llama.cpp"

# LLAMA_CURL is deprecated (ignored) in this llama.cpp; kept so older pins build the same way. OpenSSL and the
# web UI are off: the benchmark needs neither, and the prebuilt UI would be downloaded at build time.
# Static libraries make the installed binaries self-contained (no libllama.so/libggml.so beside them).
echo "llamacpp_setup.sh: configuring and building ${binaries[*]} (-j2)" >&2
start=$SECONDS
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_SYCL=OFF -DGGML_OPENCL=OFF \
  -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_RPC=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$work/configure.log" 2>&1 \
  || { tail -40 "$work/configure.log" >&2; die "cmake configure failed"; }
cmake --build "$work/build" --config Release -j2 --target "${binaries[@]}" >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log" >&2; die "build failed"; }
echo "llamacpp_setup.sh: built in $((SECONDS - start)) s" >&2

# Install into a sibling directory and rename it into place, so an interrupted run never looks complete.
staging=$prefix.partial
rm -rf "$staging"
mkdir -p "$staging/bin"
for b in "${binaries[@]}"; do install -m 755 "$work/build/bin/$b" "$staging/bin/$b"; done
cp "$src/convert_hf_to_gguf.py" "$src/LICENSE" "$staging/"
cp -r "$src/conversion" "$src/gguf-py" "$staging/"
echo "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION" >"$staging/.complete"
rm -rf "$prefix"
mv "$staging" "$prefix"
complete || die "install in $prefix is incomplete"
echo "$prefix"
