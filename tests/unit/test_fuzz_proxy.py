"""Bad input against the real proxy (fake cluster behind it): generated requests, raw malformed HTTP,
gzip bombs, deep nesting, huge parameters. Never a 5xx the sidecar made itself; every rejection of its
own in Elasticsearch's error shape; a reranked 200 only with finite scores. benchmarks/fuzz.py runs
the same generator for >= 10,000 examples."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from tests.support.fuzz_strategies import requests
from tests.support.fuzzing import (
    RAW_HTTP,
    Raw,
    bmx_body,
    es_error_shape,
    gzip_bomb,
    nest,
    problems,
    running,
    send,
)
from tests.support.proxy_process import proc_status

SEARCH = "/docs/_search"
JSON = (("Content-Type", "application/json"),)


@pytest.fixture(scope="module")
def servers():
    with running() as s:
        yield s


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(raw=requests())
def test_generated_bad_requests_never_get_a_sidecar_5xx(servers, raw):
    answer = send(servers, raw)
    assert problems(raw, answer) == [], raw.describe()


@pytest.mark.parametrize(
    "bmx",
    [
        {"alpha": 1e308},
        {"beta": 1e308},
        {"alpha": 1e308, "beta": 1e308},
        {"alpha": -1e308},
        {"k1": 1e308, "mode": "bm25"},
        {"b": 1e308, "mode": "bm25"},
        {"min_score": -1e308},
        {"window_size": 10**9},
        {"window_size": 2**63},
        {"augment": {"queries": ["t0"] * 2000, "weights": [0.5] * 2000}},
        {"augment": {"queries": ["t0"], "weights": [1e308]}},
    ],
    ids=repr,
)
def test_extreme_parameters_are_a_400_or_finite_scores(servers, bmx):
    raw = Raw("POST", SEARCH, JSON, bmx_body(**bmx))
    answer = send(servers, raw)
    assert problems(raw, answer) == [], answer.body[:300]
    assert answer.status in (200, 400), answer.body[:300]


@pytest.mark.parametrize("where", ["bmx", "query", "objects", "bare"])
@pytest.mark.parametrize("depth", [254, 600, 1000, 5000])
def test_deep_nesting_is_not_a_500(servers, where, depth):
    raw = Raw("POST", SEARCH, JSON, nest(depth, where))
    answer = send(servers, raw)
    assert problems(raw, answer) == []


def test_gzip_bomb_does_not_inflate_in_memory(servers):
    """200 MiB of JSON in ~200 KiB of gzip: the proxy must not hold it inflated."""
    bomb = gzip_bomb(200 << 20)
    assert len(bomb) < 400_000
    before = proc_status()["VmRSS"]
    raw = Raw("POST", SEARCH, (*JSON, ("Content-Encoding", "gzip")), bomb)
    answer = send(servers, raw)
    assert problems(raw, answer) == []
    grown_mib = (proc_status()["VmRSS"] - before) / 1024
    assert grown_mib < 100, f"RSS grew {grown_mib:.0f} MiB for a {len(bomb)} B body"


def test_body_labelled_gzip_that_is_not_is_no_502(servers):
    raw = Raw("POST", SEARCH, (*JSON, ("Content-Encoding", "gzip")), bmx_body())
    answer = send(servers, raw)
    assert problems(raw, answer) == []
    assert answer.status != 502, answer.body[:300]


@pytest.mark.parametrize("wire", list(RAW_HTTP.values()), ids=list(RAW_HTTP))
def test_malformed_http_is_answered_in_elasticsearch_shape(servers, wire):
    answer = send(servers, wire.encode("latin-1"))
    assert answer.status > 0, f"no HTTP/1.x answer: {answer.body[:200]!r}"
    assert answer.status < 500 or answer.headers.get("x-fake-upstream") == "1", answer.body[:300]
    if answer.status >= 400 and answer.headers.get("x-fake-upstream") != "1":
        assert es_error_shape(answer.body, answer.status) is None, answer.body[:300]


def test_a_request_line_of_another_http_version_is_a_400_on_an_http_1_1_status_line(servers):
    """As Elasticsearch answers `GET / HTTP/2.0` (400, naming the version), but on a status line an
    HTTP/1.x client parses (the server would echo HTTP/2.0)."""
    answer = send(servers, RAW_HTTP["HTTP/2.0 on a 1.1 socket"].encode("latin-1"))
    assert answer.status == 400, answer.body[:300]
    assert es_error_shape(answer.body, 400) is None
    assert b"Unexpected http protocol version: HTTP/2.0" in answer.body
