#!/usr/bin/env bash
# podman's Docker-compatible API for testcontainers: `source scripts/podman_service.sh` starts
# `podman system service` on a socket of its own (runc and explicit ulimits via docker/containers.conf)
# and exports DOCKER_HOST, TESTCONTAINERS_CONNECTION_MODE, TESTCONTAINERS_RYUK_DISABLED=true (podman removes what the tests stop; the
# reaper image is not available without a registry) and BMX_PODMAN_SERVICE_PID (kill it when done).
ROOT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT_DIR/docker/containers.conf}"
_sock="$(mktemp -u /tmp/bmx-podman-XXXXXX.sock)"
podman system service --time=0 "unix://$_sock" >/dev/null 2>&1 &
export BMX_PODMAN_SERVICE_PID=$!
for _ in $(seq 100); do [ -S "$_sock" ] && break; sleep 0.1; done
# docker_host: this machine may itself look like a container, but podman publishes ports right here.
export DOCKER_HOST="unix://$_sock" TESTCONTAINERS_RYUK_DISABLED=true TESTCONTAINERS_CONNECTION_MODE=docker_host
