#!/usr/bin/env bash
# Creates .venv with the operator and its dev tools (idempotent: re-run to pick up dependency changes).
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -f $stamp ]]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
