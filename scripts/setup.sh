#!/usr/bin/env bash
# Creates .venv and installs the project with its test extras (idempotent; fast when already done).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.bmx-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e '.[test]'
  touch "$stamp"
fi
for tool in java mvn unzip; do
  command -v "$tool" >/dev/null || echo "warning: '$tool' not found; the built-in engines need it (see docs/engines.md)" >&2
done
