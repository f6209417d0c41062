#!/usr/bin/env bash
# The project's test command: installs, brings up four real engines — Elasticsearch 8.19 and 9.1,
# OpenSearch 2.19 and 3.3 — (unless BMX_TEST_<ENGINE>_URL points at one already), runs every test
# (each engine-parametrized test once per engine), and stops the engines it started, even when tests
# fail. Integration tests may not skip here.
#
# The second major of each kind runs beside the first under its own state directory
# (<state>/elasticsearch9, <state>/opensearch3). Ports: BMX_TEST_<ENGINE>_PORT; by default 9200 and
# 9201 for the first two (the launcher's defaults), any free port for the other two.
# BMX_TEST_ENGINES (e.g. "elasticsearch9 opensearch") runs a subset: a CI rotation, see docs/engines.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# valgrind (callgrind) for benchmarks/first_sight_cpu.py's small run: Debian's package, installed when
# missing (a fresh machine), as root with apt; otherwise its test says what is missing.
if ! command -v valgrind >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing valgrind from Debian's packages" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >&2
fi
state_base=${BMX_RERANK_STATE:-$(python -c 'from bmx_rerank.testing.host import state_dir; print(state_dir())')}

free_port() { python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# id kind version default-port
ENGINES=(
  "elasticsearch elasticsearch 8.19.21 9200"
  "opensearch opensearch 2.19.3 9201"
  "elasticsearch9 elasticsearch 9.1.0 free"
  "opensearch3 opensearch 3.3.2 free"
)

started=()  # "state-dir kind" of each engine this run started
cleanup() {
  # ${a[@]+...}: an empty array is "unbound" under `set -u` in bash < 4.4 (macOS's bash 3.2)
  for entry in ${started[@]+"${started[@]}"}; do
    BMX_RERANK_STATE=${entry%% *} bmx-rerank engine stop "${entry##* }" >/dev/null 2>&1 || true
  done
  if [ -n "${BMX_PODMAN_SERVICE_PID:-}" ]; then kill "$BMX_PODMAN_SERVICE_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

# Start the missing engines side by side (each start waits for its cluster's health), then read
# their URLs; one failed start fails the run after the others are up (and are stopped on exit).
logs=$(mktemp -d)
pids=()
for spec in "${ENGINES[@]}"; do
  read -r id kind version port <<<"$spec"
  upper=$(echo "$id" | tr a-z A-Z)
  var=BMX_TEST_${upper}_URL
  port_var=BMX_TEST_${upper}_PORT
  [ -z "${!var:-}" ] || continue
  if [ -n "${BMX_TEST_ENGINES:-}" ] && [[ " ${BMX_TEST_ENGINES//,/ } " != *" $id "* ]]; then continue; fi
  state=$state_base
  [ "$id" = "$kind" ] || state=$state_base/$id
  # Remember what this run starts (not an engine that was already up), then start it.
  BMX_RERANK_STATE=$state bmx-rerank engine status "$kind" >/dev/null 2>&1 || started+=("$state $kind")
  [ "$port" != free ] || port=$(free_port)
  BMX_RERANK_STATE=$state bmx-rerank engine start "$kind" --version "$version" \
    --port "${!port_var:-$port}" >"$logs/$id" 2>&1 &
  pids+=("$!")
done
failed=0
for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" || failed=1; done
for spec in "${ENGINES[@]}"; do
  read -r id kind version port <<<"$spec"
  var=BMX_TEST_$(echo "$id" | tr a-z A-Z)_URL
  if [ -z "${!var:-}" ] && [ -f "$logs/$id" ]; then
    cat "$logs/$id" >&2
    export "$var=$(tail -n 1 "$logs/$id")"
  fi
  echo "$id: ${!var:-(not in this run)}"
done
rm -rf "$logs"
[ "$failed" = 0 ] || { echo "an engine failed to start (see above)" >&2; exit 1; }

# The images (docker/), built with podman from Debian bases cached on disk; test_container.py runs them.
export CONTAINERS_CONF="$PWD/docker/containers.conf"
bash scripts/build_image.sh

export BMX_REQUIRE_ENGINES=1  # a missing engine fails the integration tests instead of skipping them
python -m pytest -p no:cacheprovider "$@"

# testcontainers for real, through podman's Docker API: one integration module with Elasticsearch in a
# container of the image built above (OpenSearch stays where it is).
if [ $# -eq 0 ]; then
  source scripts/podman_service.sh
  BMX_TEST_ENGINES=elasticsearch BMX_TEST_ELASTICSEARCH_URL= \
    BMX_TEST_ELASTICSEARCH_IMAGE=localhost/bmx-rerank-elasticsearch:8.19.21 \
    python -m pytest -p no:cacheprovider tests/integration/test_proxy.py -k "elasticsearch and not elasticsearch9"
fi
