#!/bin/bash
# Start the engine with every dotted lower-case environment variable as a setting (-Ename=value), as the
# official images do, so `discovery.type=single-node` or `xpack.security.enabled=false` work as env.
set -euo pipefail
args=()
while IFS='=' read -r name value; do
    if [[ $name =~ ^[a-z0-9_]+\.[a-z0-9_.]+$ ]]; then
        args+=("-E" "$name=$value")
    fi
done < <(env)
exec "/opt/engine/bin/${ENGINE_KIND}" "${args[@]}" "$@"
