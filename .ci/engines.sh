#!/usr/bin/env bash
# Start/stop the real Elasticsearch and OpenSearch used by the integration tests (no Docker needed).
#
#   eval "$(.ci/engines.sh start [ENV_FILE])"   # stdout: export BMX_TEST_*_URL=... lines (also written to ENV_FILE)
#   .ci/engines.sh stop                          # stops both (safe to call when nothing runs)
#
# Both engines start in parallel (about 15 s warm, plus the one-time download from Maven Central).
# Versions/ports: BMX_CI_ES_VERSION (8.19.21), BMX_CI_OS_VERSION (2.19.3), BMX_CI_ES_PORT (9200),
# BMX_CI_OS_PORT (9201). Progress and errors go to stderr; on failure the exit code is non-zero and the
# engine's log tail is shown. Call `stop` from your EXIT trap.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bmx="${BMX_RERANK:-$root/.venv/bin/bmx-rerank}"
[ -x "$bmx" ] || bmx="$(command -v bmx-rerank)" || { echo "bmx-rerank not found: install the project first" >&2; exit 1; }

start() {
  local env_file=${1:-} tmp es_pid os_pid rc=0
  tmp="$(mktemp -d)"
  "$bmx" engine start elasticsearch --version "${BMX_CI_ES_VERSION:-8.19.21}" --port "${BMX_CI_ES_PORT:-9200}" \
    >"$tmp/es.url" 2>"$tmp/es.err" & es_pid=$!
  "$bmx" engine start opensearch --version "${BMX_CI_OS_VERSION:-2.19.3}" --port "${BMX_CI_OS_PORT:-9201}" \
    >"$tmp/os.url" 2>"$tmp/os.err" & os_pid=$!
  wait "$es_pid" || rc=1
  wait "$os_pid" || rc=1
  cat "$tmp/es.err" "$tmp/os.err" >&2
  if [ "$rc" -ne 0 ]; then rm -rf "$tmp"; exit 1; fi
  local lines
  lines="export BMX_TEST_ELASTICSEARCH_URL=$(tail -n 1 "$tmp/es.url")
export BMX_TEST_OPENSEARCH_URL=$(tail -n 1 "$tmp/os.url")"
  rm -rf "$tmp"
  echo "$lines"
  if [ -n "$env_file" ]; then echo "$lines" >>"$env_file"; fi
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) "$bmx" engine stop elasticsearch >&2; "$bmx" engine stop opensearch >&2 ;;
  status) "$bmx" engine status ;;
  *) echo "usage: $0 start [ENV_FILE] | stop | status" >&2; exit 2 ;;
esac
