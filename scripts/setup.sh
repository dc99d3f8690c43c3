#!/usr/bin/env bash
# Creates .venv with the operator and its dev tools (idempotent: re-run to pick up dependency changes). Says what it
# does as it goes: a first run installs ~60 packages from PyPI, about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp ]]; then
  started=$SECONDS
  say() { echo "setup.sh [$((SECONDS - started))s] $*" >&2; }
  say "creating .venv ($(python3 --version))"
  python3 -m venv .venv
  say "upgrading pip"
  .venv/bin/python -m pip install -q --upgrade pip
  say "installing cpullm-operator and its dev tools (pyproject.toml's [dev]) from PyPI"
  .venv/bin/python -m pip install -q --progress-bar off -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
  say "done: .venv/bin/cpullm $(.venv/bin/cpullm --version | cut -d' ' -f2)"
fi
