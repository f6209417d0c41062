#!/bin/bash
# Start the engine with every dotted lower-case environment variable as a setting (-Ename=value), as the
# official images do, so `discovery.type=single-node` or `xpack.security.enabled=false` work as env.
# ELASTIC_PASSWORD (Elasticsearch with security on): the `elastic` user's bootstrap password, put in
# the keystore.
set -euo pipefail
if [[ -n ${ELASTIC_PASSWORD:-} && $ENGINE_KIND == elasticsearch ]]; then
    keystore=/opt/engine/bin/elasticsearch-keystore
    [[ -f /opt/engine/config/elasticsearch.keystore ]] || "$keystore" create >/dev/null
    printf '%s' "$ELASTIC_PASSWORD" | "$keystore" add -x -f bootstrap.password >/dev/null
fi
args=()
while IFS='=' read -r name value; do
    if [[ $name =~ ^[a-z0-9_]+\.[a-z0-9_.]+$ ]]; then
        args+=("-E" "$name=$value")
    fi
done < <(env)
exec "/opt/engine/bin/${ENGINE_KIND}" "${args[@]}" "$@"
