"""The proxy's bounds in front of real engines: bodies past the inflation cap answered as the cluster
answers them (streamed as sent, their nesting counted on the way), bad encodings, deep nesting,
out-of-range values and windows, msearch caps, readiness."""

from __future__ import annotations

import gzip
import json
import random
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from bmx_rerank.stats.cache import StatsCache
from tests.support.corpora import bulk
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

MAPPINGS = {"properties": {"body": {"type": "text", "analyzer": "standard"}}}
DOCS = {str(i): {"body": text} for i, text in enumerate(["red fox", "red red dog", "blue fox jumps", "dog"])}


@pytest.fixture
def guarded(engine: EngineClient, make_index) -> Iterator[tuple[EngineClient, str, ProxyThread]]:
    index = make_index(MAPPINGS)
    bulk(engine, index, DOCS)
    proxy = ProxyThread(
        engine.url,
        lambda session, base: StatsCache(session, base, timeout=5.0),
        max_body=64 << 10,
        max_window=50,
        max_augment=2,
        max_msearch=1,
        timeout=10.0,
    )
    try:
        yield engine, index, proxy
    finally:
        proxy.close()


def send(url: str, path: str, data: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, Any]:
    request = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


JSON = {"Content-Type": "application/json"}


def bmx(**extra: Any) -> dict[str, Any]:
    return {"size": 2, "query": {"match": {"body": "red fox"}}, "ext": {"bmx": {"field": "body", **extra}}}


def test_a_body_inflating_past_the_cap_gets_the_clusters_own_answer(guarded):
    engine, index, proxy = guarded
    body = json.dumps({**bmx(), "pad": " " * (4 << 20)}).encode()  # 4 MiB inflated, a few KiB sent
    data = gzip.compress(body)
    headers = {**JSON, "Content-Encoding": "gzip"}
    direct = send(engine.url, f"/{index}/_search", data, headers)
    through = send(proxy.url, f"/{index}/_search", data, headers)
    assert through[0] == direct[0] == 400, "the cluster refuses the unknown key, as without the proxy"
    assert through[1]["error"]["type"] == direct[1]["error"]["type"]
    small = gzip.compress(json.dumps(bmx(window_size=10)).encode())
    status, answer = send(proxy.url, f"/{index}/_search", small, headers)
    assert status == 200 and answer["_bmx"]["reranked"] is True, "a body within the cap is reranked"


def test_a_body_labelled_gzip_that_is_not_is_a_400_in_es_shape(guarded):
    _, index, proxy = guarded
    status, answer = send(
        proxy.url, f"/{index}/_search", json.dumps(bmx()).encode(), {**JSON, "Content-Encoding": "gzip"}
    )
    assert status == 400 and answer["error"]["type"] == "parse_exception" and answer["status"] == 400


@pytest.mark.parametrize("depth", [300, 600, 1000])
def test_deep_nesting_is_a_400_never_a_500(guarded, depth):
    engine, index, proxy = guarded
    deep = b'{"query":{"match_all":{}},"aggs":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"
    direct = send(engine.url, f"/{index}/_search", deep, JSON)
    through = send(proxy.url, f"/{index}/_search", deep, JSON)
    assert direct[0] == 400 and through[0] == 400, "the cluster refuses it, and the guard before it"
    assert through[1]["error"]["type"] == "x_content_parse_exception"
    nested = (
        b'{"ext":{"bmx":{"field":"body","query":"red"}},"aggs":{"x":' + b"[" * depth + b"]" * depth + b"}}"
    )
    status, answer = send(proxy.url, f"/{index}/_search", nested, JSON)
    assert status == 400 and answer["error"]["type"] == "x_content_parse_exception"


def _bools(depth: int) -> bytes:
    return b'{"query":' + b'{"bool":{"must":[' * depth + b'{"match_all":{}}' + b"]}}" * depth + b"}"


# 200 KB of a string full of brackets, escaped quotes and backslashes, none of them nesting.
PAD = b"".join(
    random.Random(19).choice([b"[", b"{", b"]", b"}", b'\\"', b"\\\\", b"a"]) for _ in range(100_000)
)


def _padded(query: bytes, ext: bytes = b"") -> bytes:
    """A search over the fixture's --max-body: `query` under a bool named by PAD, so that the proxy
    streams it up unread, PAD first (several chunks before `query`)."""
    return b'{"query":{"bool":{"_name":"' + PAD + b'","must":[' + query + b"]}}" + ext + b"}"


@pytest.mark.parametrize(
    "data",
    [
        _bools(2000),  # killed an OpenSearch 2.19 node (StackOverflowError) when it reached it
        b'{"ext":{"bmx":{"field":"body","query":"red","x":' + b"[" * 400 + b"]" * 400 + b"}}}",
        b'{"ext":{"bmx":{"field":"body","query":"red","x":' + b'{"a":' * 1100 + b"1" + b"}" * 1100 + b"}}}",
        _bools(31),
        _padded(_bools(2000)[len(b'{"query":') : -1]),  # streamed unread: counted on the way
        _padded(b'{"match_all":{}}', b',"ext":{"bmx":{"field":"body","x":' + b"[" * 400 + b"]" * 400 + b"}}"),
    ],
    ids=["bool-2000", "ext.bmx-400", "ext.bmx-1100", "bool-31", "streamed-bool-2000", "streamed-ext.bmx-400"],
)
@pytest.mark.parametrize("path", ["_search", "_msearch"])
def test_bodies_that_harm_a_node_never_reach_it(guarded, data, path):
    """Refused by the proxy (sent only through it: they kill an OpenSearch node), and the node stays up."""
    engine, index, proxy = guarded
    headers = JSON
    if path == "_msearch":
        data, headers = b"{}\n" + data + b"\n", {"Content-Type": "application/x-ndjson"}
    status, answer = send(proxy.url, f"/{index}/{path}", data, headers)
    assert status == 400 and answer["error"]["type"] == "x_content_parse_exception", answer
    assert "--max-" in answer["error"]["reason"], "the guard's answer, not the cluster's"
    with urllib.request.urlopen(engine.url + "/_cluster/health", timeout=10) as resp:
        assert resp.status == 200, "the node is up"
    status, answer = send(proxy.url, f"/{index}/_search", json.dumps(bmx()).encode(), JSON)
    assert status == 200 and answer["_bmx"]["reranked"] is True


def test_a_yaml_body_gets_the_raw_count_too(guarded):
    """Every engine reads YAML search bodies, and YAML's flow style nests with JSON's brackets: a bool
    query 2,000 deep in it is refused as the JSON one is, and the node stays up; a shallow one goes up as
    sent and comes back as the cluster's YAML answer."""
    engine, index, proxy = guarded
    yaml = {"Content-Type": "application/yaml"}
    deep = b"query: " + b"{bool: {must: [" * 2000 + b"{match_all: {}}" + b"]}}" * 2000 + b"\n"
    request = urllib.request.Request(f"{proxy.url}/{index}/_search", data=deep, headers=yaml, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    answer = json.loads(refused.value.read())
    assert refused.value.code == 400 and "--max-depth" in answer["error"]["reason"], answer
    assert engine.call("GET", "/_cluster/health").status == 200, "the node is up"
    shallow = b"size: 1\nsort: [_doc]\nquery: {match: {body: red}}\n"
    answers = []
    for url in (engine.url, proxy.url):
        request = urllib.request.Request(f"{url}/{index}/_search", data=shallow, headers=yaml, method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            answers.append(resp.read())
    assert all(a.startswith(b"---\n") for a in answers) and b"_id:" in answers[0], answers
    assert answers[0].split(b"hits:")[1] == answers[1].split(b"hits:")[1], "the cluster's own hits"


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
def test_a_body_over_max_body_streams_up_as_sent_and_is_answered_as_directly(guarded, encoding):
    """Over --max-body the proxy does not read a body but counts its nesting on the way (inflated
    first): brackets, quotes and backslashes inside its strings do not count, and the cluster answers
    the bytes as sent, as it answers them directly."""
    engine, index, proxy = guarded
    data = _padded(b'{"match":{"body":"red"}}')
    assert len(data) > 64 << 10, "past the fixture's --max-body (once inflated)"
    headers = dict(JSON)
    if encoding == "gzip":
        data, headers = gzip.compress(data), {**JSON, "Content-Encoding": "gzip"}
    direct = send(engine.url, f"/{index}/_search", data, headers)
    through = send(proxy.url, f"/{index}/_search", data, headers)
    assert direct[0] == through[0] == 200, through
    ids = [[h["_id"] for h in answer["hits"]["hits"]] for _, answer in (direct, through)]
    assert ids[0] == ids[1] and len(ids[0]) == 2, ids
    assert through[1]["hits"]["hits"][0]["matched_queries"] == [json.loads(b'"' + PAD + b'"')]


def test_a_body_over_max_content_length_is_a_413(engine, make_index):
    index = make_index(MAPPINGS)
    proxy = ProxyThread(
        engine.url, lambda session, base: StatsCache(session, base, timeout=5.0), max_content_length=1 << 20
    )
    try:
        body = json.dumps({**bmx(), "pad": " " * (2 << 20)}).encode()
        status, answer = send(proxy.url, f"/{index}/_search", body, JSON)
        assert status == 413 and answer["error"]["type"] == "content_too_long_exception"
    finally:
        proxy.close()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"alpha": 1e308}, "[alpha] must be a number in"),
        ({"beta": 1e308}, "[beta] must be a number in"),
        ({"window_size": 51}, "--max-window"),
        ({"augment": {"queries": ["a", "b", "c"]}}, "--max-augment"),
    ],
)
def test_values_beyond_the_bounds_are_400s(guarded, extra, needle):
    _, index, proxy = guarded
    status, answer = send(proxy.url, f"/{index}/_search", json.dumps(bmx(**extra)).encode(), JSON)
    assert status == 400 and needle in answer["error"]["reason"], answer


def test_msearch_items_past_the_cap_get_the_clusters_answer_marked(guarded):
    _, index, proxy = guarded
    lines = [{"index": index}, bmx(window_size=10)] * 2
    data = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    status, answer = send(proxy.url, "/_msearch", data, {"Content-Type": "application/x-ndjson"})
    first, second = answer["responses"]
    assert status == 200 and first["_bmx"]["reranked"] is True
    assert (
        second["_bmx"] == {"reranked": False, "skipped": "max_msearch"} and len(second["hits"]["hits"]) == 2
    )


def test_ready_and_malformed_http_in_es_shape(guarded):
    _, _, proxy = guarded
    with urllib.request.urlopen(proxy.url + "/_bmx/ready", timeout=30) as resp:
        ready = json.loads(resp.read())
    assert ready["status"] == "ready" and ready["checks"]["upstream"] == "ok"
    host, port = proxy.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"get / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert (
        head.split(b" ")[1] == b"405" and json.loads(body)["error"]["type"] == "method_not_allowed_exception"
    )


def test_a_bulk_labelled_gzip_that_is_not_is_a_400_not_an_outage(guarded):
    """The cluster closes the connection on such a body; through the proxy the client learns why."""
    engine, index, proxy = guarded
    data = json.dumps({"index": {"_index": index, "_id": "x"}}).encode() + b'\n{"body": "x"}\n'
    headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
    status, answer = send(proxy.url, "/_bulk", data, headers)
    assert status == 400 and answer["error"]["type"] == "parse_exception"
    status, answer = send(proxy.url, "/_bulk?refresh=true", gzip.compress(data), headers)
    assert status == 200 and not answer["errors"], "a valid compressed bulk goes through untouched"
