# Elasticsearch or OpenSearch from the same Maven Central "integ-test-zip" archive the tests' launcher
# uses (bmx_rerank/testing/engine.py), on a Debian base with a Java 17 runtime: built by
# `bash scripts/build_image.sh engine`, run by compose and by testcontainers. Settings come from
# dotted environment variables (discovery.type=single-node, ...), as with the official images.
ARG BASE
FROM ${BASE}
ARG KIND=elasticsearch
ARG VERSION=8.19.21
COPY engine.zip /tmp/engine.zip
COPY docker/engine-entrypoint.sh /usr/local/bin/engine-entrypoint
RUN unzip -q /tmp/engine.zip -d /opt && rm /tmp/engine.zip \
    && mv /opt/${KIND}-${VERSION} /opt/engine \
    && useradd --system --home-dir /opt/engine engine \
    && mkdir -p /opt/engine/data /opt/engine/logs \
    && printf 'network.host: 0.0.0.0\nhttp.port: 9200\npath.data: /opt/engine/data\npath.logs: /opt/engine/logs\n' \
       >> /opt/engine/config/${KIND}.yml \
    && chown -R engine /opt/engine && chmod 0755 /usr/local/bin/engine-entrypoint
ENV ENGINE_KIND=${KIND} ES_JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    OPENSEARCH_JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    ES_JAVA_OPTS="-Xms512m -Xmx512m" OPENSEARCH_JAVA_OPTS="-Xms512m -Xmx512m"
USER engine
WORKDIR /opt/engine
EXPOSE 9200
ENTRYPOINT ["/usr/local/bin/engine-entrypoint"]
