"""Real Elasticsearch and OpenSearch for integration tests.

Where the engines come from, first match wins:
1. `BMX_TEST_ELASTICSEARCH_URL` / `BMX_TEST_OPENSEARCH_URL` (e.g. from `bmx-rerank engine start ...`);
2. testcontainers, when a Docker engine answers (images overridable with `BMX_TEST_*_IMAGE`);
3. otherwise the tests skip, or fail when `BMX_REQUIRE_ENGINES=1` (as `scripts/test.sh` sets).

Further engines join the parametrization when their variable is set: `BMX_TEST_ELASTICSEARCH9_URL`
and `BMX_TEST_OPENSEARCH3_URL` (another major of the same kind, as `scripts/test.sh` starts them), so
every test that takes `engine`/`engine_url` runs once per configured engine.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_client import EngineClient, MakeIndex, unavailable

KINDS = ("elasticsearch", "opensearch")
URL_VARS = {"elasticsearch": "BMX_TEST_ELASTICSEARCH_URL", "opensearch": "BMX_TEST_OPENSEARCH_URL"}
# Engine id -> (kind, variable): the two defaults always take part (testcontainers or a skip/fail
# when unset), the other majors only when their URL is set.
EXTRA_ENGINES = {
    "elasticsearch9": ("elasticsearch", "BMX_TEST_ELASTICSEARCH9_URL"),
    "opensearch3": ("opensearch", "BMX_TEST_OPENSEARCH3_URL"),
}


def engine_ids() -> list[str]:
    """The engines this run covers, in a stable order: defaults first, then each configured extra; or
    exactly those `BMX_TEST_ENGINES` lists (a CI rotation: see docs/engines.md)."""
    known = [*KINDS, *EXTRA_ENGINES]
    chosen = os.environ.get("BMX_TEST_ENGINES", "").replace(",", " ").split()
    if chosen:
        unknown = sorted(set(chosen) - set(known))
        if unknown:
            raise pytest.UsageError(f"BMX_TEST_ENGINES: unknown engine(s) {unknown}; known: {known}")
        return [e for e in known if e in chosen]
    return [*KINDS, *(name for name, (_, var) in EXTRA_ENGINES.items() if os.environ.get(var, "").strip())]


IMAGE_VARS = {"elasticsearch": "BMX_TEST_ELASTICSEARCH_IMAGE", "opensearch": "BMX_TEST_OPENSEARCH_IMAGE"}
DEFAULT_IMAGES = {
    "elasticsearch": "docker.elastic.co/elasticsearch/elasticsearch:8.19.21",
    "opensearch": "opensearchproject/opensearch:2.19.3",
}
HEAP = "-Xms512m -Xmx512m"


def _check_engine(kind: str, url: str, source: str) -> None:
    """Fail loudly when the URL does not answer or is the other engine (ES tags every response)."""
    try:
        resp = EngineClient(kind, url).call("GET", "/_cluster/health")
    except OSError as exc:
        pytest.fail(f"{source}={url} does not answer /_cluster/health: {exc}", pytrace=False)
    if resp.status != 200:
        pytest.fail(f"{source}={url}: /_cluster/health answered {resp.status}: {resp.body}", pytrace=False)
    if _kind_of(url) != kind:
        pytest.fail(f"{source}={url} is not {kind} but {_kind_of(url)}", pytrace=False)


def _docker_reachable() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no SDK, no socket, no daemon: all mean "no Docker here"
        return False
    return True


def _container(kind: str, image: str) -> Any:
    """A testcontainers container for `kind` (modules moved to testcontainers.community in 4.x)."""
    if kind == "elasticsearch":
        try:
            from testcontainers.community.elasticsearch import ElasticSearchContainer
        except ImportError:
            from testcontainers.elasticsearch import ElasticSearchContainer
        from testcontainers.core.wait_strategies import HttpWaitStrategy

        # Older releases raise ValueError on 9.x tags (testcontainers-python#860). Ready when the
        # cluster's health answers: the integ-test-zip images (scripts/build_image.sh) have no `GET /`.
        container = ElasticSearchContainer(image, mem_limit="2G").with_env("ES_JAVA_OPTS", HEAP)
        return container.waiting_for(HttpWaitStrategy(9200, "/_cluster/health").with_startup_timeout(300))
    try:
        from testcontainers.community.opensearch import OpenSearchContainer
    except ImportError:
        from testcontainers.opensearch import OpenSearchContainer
    return OpenSearchContainer(image).with_env("OPENSEARCH_JAVA_OPTS", HEAP)


def _engine_url(kind: str) -> Iterator[str]:
    env_var = URL_VARS[kind]
    url = os.environ.get(env_var, "").strip().rstrip("/")
    if url:
        _check_engine(kind, url, env_var)
        yield url
        return
    if not _docker_reachable():
        unavailable(
            f"no {kind}: set {env_var} (e.g. `export {env_var}=$(bmx-rerank engine start {kind} | tail -n1)`) "
            "or make a Docker engine reachable for testcontainers"
        )
    image = os.environ.get(IMAGE_VARS[kind]) or DEFAULT_IMAGES[kind]
    container = _container(kind, image)
    container.start()
    try:
        # get_url() is gone from ElasticSearchContainer (testcontainers-python#980): build it.
        url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(container.port)}"
        _check_engine(kind, url, f"testcontainers {image}")
        yield url
    finally:
        container.stop()


@pytest.fixture(scope="session")
def elasticsearch_url() -> Iterator[str]:
    """Base URL of a real Elasticsearch (plain HTTP, no auth)."""
    yield from _engine_url("elasticsearch")


@pytest.fixture(scope="session")
def opensearch_url() -> Iterator[str]:
    """Base URL of a real OpenSearch (plain HTTP, no auth)."""
    yield from _engine_url("opensearch")


def _extra_url(name: str) -> str:
    kind, var = EXTRA_ENGINES[name]
    url = os.environ.get(var, "").strip().rstrip("/")
    if not url:
        unavailable(f"no {name}: set {var} (e.g. from `bmx-rerank engine start {kind} --version ...`)")
    _check_engine(kind, url, var)
    return url


@pytest.fixture(scope="session", params=engine_ids(), ids=engine_ids())
def engine_url(request: pytest.FixtureRequest) -> str:
    """Each configured engine in turn: the same test runs against every kind and major version."""
    if request.param in EXTRA_ENGINES:
        return _extra_url(request.param)
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture(params=[e for e in engine_ids() if e in KINDS])
def cluster_kind(request: pytest.FixtureRequest) -> str:
    """Each default kind of this run (elasticsearch, opensearch; not the extra majors), for the tests that
    start a cluster of their own from the launcher's default version of it."""
    return request.param


def _kind_of(url: str) -> str:
    """Which engine answers at `url`: Elasticsearch tags every response with X-elastic-product."""
    headers = EngineClient("?", url).call("GET", "/_cluster/health").headers
    return "elasticsearch" if headers.get("X-elastic-product") == "Elasticsearch" else "opensearch"


def _version_of(url: str) -> str:
    """The server's version from `GET /_nodes/_local` (`GET /` is missing from the ES integ-test zip)."""
    nodes = EngineClient("?", url).ok("GET", "/_nodes/_local", params={"filter_path": "nodes.*.version"})
    return str(next(iter(nodes["nodes"].values()))["version"])


@pytest.fixture(scope="session")
def engine(engine_url: str) -> EngineClient:
    """An HTTP client for the current `engine_url`, knowing which engine and version it is."""
    return EngineClient(_kind_of(engine_url), engine_url, _version_of(engine_url))


@pytest.fixture
def make_index(engine: EngineClient) -> Iterator[MakeIndex]:
    """Create uniquely named indices (1 shard, 0 replicas, so health stays green); delete them after."""
    created: list[str] = []

    def create(mappings: dict[str, Any] | None = None, settings: dict[str, Any] | None = None) -> str:
        name = f"bmx-test-{uuid.uuid4().hex[:12]}"
        body: dict[str, Any] = {
            "settings": {"number_of_shards": 1, "number_of_replicas": 0, **(settings or {})}
        }
        if mappings is not None:
            body["mappings"] = mappings
        engine.ok("PUT", f"/{name}", body)
        created.append(name)
        return name

    yield create
    for name in created:
        resp = engine.call("DELETE", f"/{name}")
        assert resp.status in (200, 404), f"could not delete test index {name}: {resp.body}"
