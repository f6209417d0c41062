"""The client wrapper's pure parts: what it reads from the official clients (node, TLS, credentials)
and from the request they built (index, query string). No engine: the clients connect lazily."""

from __future__ import annotations

import base64
import ssl

import pytest
from elasticsearch import AsyncElasticsearch, Elasticsearch
from opensearchpy import OpenSearch

from bmx_rerank.client import AsyncBMXClient, BMXClient, query_strings, search_index, sidecar_of

BASIC = "Basic " + base64.b64encode(b"u:p").decode()


@pytest.mark.parametrize(
    ("path", "index"),
    [
        ("/_search", "_all"),
        ("/a,b/_search", "a,b"),
        ("/logs-%2A/_search", "logs-*"),
        ("/a/_doc/1", None),
        ("/_search/scroll", None),
        ("/a/_msearch", None),
    ],
)
def test_search_index_reads_the_path_the_client_built(path: str, index: str | None):
    assert search_index(path) == index


def test_query_strings_are_what_the_clients_put_on_the_url():
    params = {"filter_path": ["hits.hits._id", "_bmx"], "track_total_hits": False, "size": 3, "x": None}
    assert query_strings(params) == {
        "filter_path": "hits.hits._id,_bmx",
        "track_total_hits": "false",
        "size": "3",
    }
    assert query_strings({"filter_path": b"a,b"}) == {"filter_path": "a,b"}  # opensearch-py escapes to bytes


def test_elasticsearch_client_gives_node_tls_and_credentials(tmp_path):
    client = Elasticsearch(
        "https://es.example:9243/prefix", basic_auth=("u", "p"), verify_certs=False, ssl_show_warn=False
    )
    sidecar = sidecar_of(client)
    assert sidecar.url == "https://es.example:9243/prefix"
    assert sidecar.headers == {"authorization": BASIC}
    assert isinstance(sidecar.ssl, ssl.SSLContext) and sidecar.ssl.verify_mode == ssl.CERT_NONE
    api = sidecar_of(Elasticsearch("http://es:9200", api_key="k3y"))
    assert api.headers == {"authorization": "ApiKey k3y"} and api.ssl is None


def test_opensearch_client_gives_node_tls_and_credentials():
    client = OpenSearch(
        hosts=["https://os.example:9200"], http_auth=("u", "p"), verify_certs=True, ssl_show_warn=False
    )
    sidecar = sidecar_of(client)
    assert sidecar.url == "https://os.example:9200"
    assert sidecar.headers == {"authorization": BASIC}
    assert sidecar.ssl is not None and sidecar.ssl.verify_mode == ssl.CERT_REQUIRED
    assert sidecar_of(OpenSearch(hosts=["http://os:9201"]), url="http://other:1/").url == "http://other:1"


def test_a_signing_opensearch_client_is_refused_clearly():
    client = OpenSearch(hosts=["http://os:9201"], http_auth=lambda *a: {})
    with pytest.raises(TypeError, match="signs each request"):
        BMXClient(client)


def test_options_keeps_the_wrapper_and_its_sidecar():
    with BMXClient(Elasticsearch("http://es:9200")) as bmx:
        other = bmx.options(request_timeout=3)
        assert isinstance(other, BMXClient) and other._core is bmx._core
        assert (
            other.client._request_timeout == 3
            and bmx.client._request_timeout is not other.client._request_timeout
        )
    wrapper = AsyncBMXClient(AsyncElasticsearch("http://es:9200"))
    assert isinstance(wrapper.options(headers={"x": "1"}), AsyncBMXClient)


async def test_the_wrappers_sidecar_calls_keep_no_cookie():
    """The wrapper's own calls (analysis, term vectors, statistics) go with each request's credentials;
    a cookie the cluster set on one of them must not go with the next request's, for another caller."""
    import aiohttp

    wrapper = AsyncBMXClient(AsyncElasticsearch("http://es:9200"))
    try:
        wrapper._core._ready()
        assert isinstance(wrapper._core.session.cookie_jar, aiohttp.DummyCookieJar)
    finally:
        await wrapper._core.close()
        await wrapper.client.close()
