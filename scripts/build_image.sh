#!/usr/bin/env bash
# Build the images with podman, with no image registry at all:
#   bash scripts/build_image.sh            # both: localhost/bmx-rerank:latest and the engine image
#   bash scripts/build_image.sh proxy      # the sidecar (docker/Dockerfile)
#   bash scripts/build_image.sh engine     # Elasticsearch from the Maven archive (docker/engine.Dockerfile)
# Bases: Debian bookworm made with debootstrap from the mirror apt uses, imported with `podman import`,
# kept on disk (BMX_IMAGE_CACHE, default /var/cache/bmx-rerank-image) keyed by what went into them, so
# only a fresh machine pays for debootstrap. Prints each image's reference and size.
# Environment: BMX_ENGINE_VERSION (default 8.19.21), BMX_DEBIAN_MIRROR, BMX_IMAGE_CACHE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${BMX_IMAGE_CACHE:-/var/cache/bmx-rerank-image}"
# The Debian mirror apt itself uses here (deb822 sources, else a one-line sources.list).
apt_mirror() {
    local uri
    uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ {
        for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$uri" ] || { echo "build_image.sh: no Debian mirror in apt's sources: set BMX_DEBIAN_MIRROR" >&2; exit 1; }
    echo "$uri"
}
MIRROR="${BMX_DEBIAN_MIRROR:-$(apt_mirror)}"
SUITE=bookworm
ENGINE_VERSION="${BMX_ENGINE_VERSION:-8.19.21}"
BASE_RECIPE=2 # bump when base_image changes what it makes
export CONTAINERS_CONF="${CONTAINERS_CONF:-$ROOT/docker/containers.conf}"
HOST_CA=/etc/ssl/certs/ca-certificates.crt

# podman, debootstrap and runc from Debian's packages: installed here when missing (a fresh machine), as
# root with apt; otherwise say what to install.
missing=()
for tool in podman debootstrap runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing ${missing[*]} from Debian's packages" >&2
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman debootstrap runc >&2
    else
        echo "build_image.sh: ${missing[*]} missing (apt-get install -y podman debootstrap runc)" >&2
        exit 1
    fi
fi

# base_image NAME PACKAGES: a Debian base with PACKAGES, from cache when its inputs did not change.
base_image() {
    local name="$1" packages="$2" key ref tarball rootfs
    key="$(printf '%s\n' "$SUITE" "$MIRROR" "$packages" "$BASE_RECIPE" | sha256sum | cut -c1-12)"
    ref="localhost/bmx-rerank-base-$name:$key"
    if podman image exists "$ref"; then
        echo "$ref"
        return
    fi
    tarball="$CACHE/base-$name-$key.tar"
    if [[ ! -f $tarball ]]; then
        rootfs="$CACHE/rootfs-$name-$key"
        mkdir -p "$CACHE"
        rm -rf "$rootfs"
        echo "debootstrap $SUITE ($packages) from $MIRROR" >&2
        debootstrap --variant=minbase --include="$packages" "$SUITE" "$rootfs" "$MIRROR" >&2
        # What an image never needs: package caches and lists, documentation, manuals, locales.
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
            "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
            "$rootfs"/usr/share/locale/* "$rootfs"/var/log/*.log
        tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
        rm -rf "$rootfs"
    fi
    podman import --change 'CMD ["/bin/bash"]' "$tarball" "$ref" >&2
    echo "$ref"
}

report() {
    podman image inspect --format "{{.Size}}" "$1" | awk -v ref="$1" '{ printf "%s: %.0f MB\n", ref, $1 / 1e6 }'
}

build_proxy() {
    local base
    base="$(base_image python python3,python3-venv,ca-certificates)"
    local ca_args=()
    if [[ -f $HOST_CA ]]; then # the host's bundle, for a TLS-inspecting egress to the package index
        ca_args=(-v "$HOST_CA:/run/host-ca.crt:ro" --build-arg PIP_CERT_FILE=/run/host-ca.crt)
    fi
    podman build --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
        --build-arg "BASE=$base" "${ca_args[@]}" -f "$ROOT/docker/Dockerfile" \
        -t localhost/bmx-rerank:latest "$ROOT" >&2
    report localhost/bmx-rerank:latest
}

build_engine() {
    local base archive context ref
    base="$(base_image jre openjdk-17-jre-headless,unzip)"
    # The archive the launcher downloads from Maven Central (and caches), not a second download.
    archive="$("$ROOT/.venv/bin/python" -c "
from bmx_rerank.testing.artifacts import distribution_artifact, fetch_artifact
from bmx_rerank.testing.host import cache_dir
print(fetch_artifact(distribution_artifact('elasticsearch', '$ENGINE_VERSION'), cache_dir() / 'archives'))")"
    context="$(mktemp -d)"
    trap 'rm -rf "$context"' RETURN
    mkdir -p "$context/docker"
    ln "$archive" "$context/engine.zip" 2>/dev/null || cp "$archive" "$context/engine.zip"
    cp "$ROOT/docker/engine-entrypoint.sh" "$context/docker/"
    ref="localhost/bmx-rerank-elasticsearch:$ENGINE_VERSION"
    podman build --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 \
        --build-arg "BASE=$base" --build-arg KIND=elasticsearch --build-arg "VERSION=$ENGINE_VERSION" \
        -f "$ROOT/docker/engine.Dockerfile" -t "$ref" "$context" >&2
    report "$ref"
}

case "${1:-all}" in
proxy) build_proxy ;;
engine) build_engine ;;
all)
    build_proxy
    build_engine
    ;;
*)
    echo "usage: $0 [proxy|engine|all]" >&2
    exit 2
    ;;
esac
