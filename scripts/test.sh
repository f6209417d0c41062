#!/usr/bin/env bash
# The project's test command: installs, brings up real Elasticsearch and OpenSearch (unless
# BMX_TEST_ELASTICSEARCH_URL / BMX_TEST_OPENSEARCH_URL point at clusters already), runs every test,
# and stops the engines it started, even when tests fail. Integration tests may not skip here.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

started=()
cleanup() {
  for kind in "${started[@]}"; do bmx-rerank engine stop "$kind" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

engine_url() {  # KIND -> URL on the last line of `engine start`, remembering to stop it afterwards
  local kind=$1
  bmx-rerank engine status "$kind" >/dev/null 2>&1 || started+=("$kind")
  bmx-rerank engine start "$kind" | tail -n 1
}
if [ -z "${BMX_TEST_ELASTICSEARCH_URL:-}" ]; then
  BMX_TEST_ELASTICSEARCH_URL=$(engine_url elasticsearch)
  export BMX_TEST_ELASTICSEARCH_URL
fi
if [ -z "${BMX_TEST_OPENSEARCH_URL:-}" ]; then
  BMX_TEST_OPENSEARCH_URL=$(engine_url opensearch)
  export BMX_TEST_OPENSEARCH_URL
fi
echo "Elasticsearch: $BMX_TEST_ELASTICSEARCH_URL  OpenSearch: $BMX_TEST_OPENSEARCH_URL"

export BMX_REQUIRE_ENGINES=1  # a missing engine fails the integration tests instead of skipping them
python -m pytest -p no:cacheprovider "$@"
