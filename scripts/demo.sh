#!/usr/bin/env bash
# The main job: install, start a local Elasticsearch (or pass --upstream URL), load the sample corpus,
# build exact statistics, serve the proxy, and print BM25 and BMX rankings side by side.
# Extra arguments go to `bmx-rerank demo` (see `bmx-rerank demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/bmx-rerank demo "$@"
