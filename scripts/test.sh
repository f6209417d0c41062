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
  # ${a[@]+...}: an empty array is "unbound" under `set -u` in bash < 4.4 (macOS's bash 3.2)
  for kind in ${started[@]+"${started[@]}"}; do bmx-rerank engine stop "$kind" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

for kind in elasticsearch opensearch; do
  var=BMX_TEST_$(echo "$kind" | tr a-z A-Z)_URL
  if [ -z "${!var:-}" ]; then
    # Remember what this run starts (not an engine that was already up), then start it.
    bmx-rerank engine status "$kind" >/dev/null 2>&1 || started+=("$kind")
    url=$(bmx-rerank engine start "$kind" | tail -n 1)
    export "$var=$url"
  fi
done
echo "Elasticsearch: $BMX_TEST_ELASTICSEARCH_URL  OpenSearch: $BMX_TEST_OPENSEARCH_URL"

export BMX_REQUIRE_ENGINES=1  # a missing engine fails the integration tests instead of skipping them
python -m pytest -p no:cacheprovider "$@"
