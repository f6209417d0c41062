"""Hypothesis strategies for bad input to the proxy: wild and almost-right ext.bmx sections, broken,
nested, mislabelled and compressed bodies, odd targets and methods, as raw requests (`fuzzing.Raw`)."""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

from hypothesis import strategies as st

from bmx_rerank.rerank.spec import KEYS as EXT_BMX_KEYS
from tests.support.fuzzing import Raw, nest

BMX_KEYS = EXT_BMX_KEYS  # every key ext.bmx takes, so a new one is fuzzed too
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -1, 1, 10_000, 10_001, 2**31, 2**63, 1e308, -1e308, 5e-324, 1e-300]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
WILD = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
GOOD_VALUES = {
    "field": st.sampled_from(["body", "title", "", "body.keyword"]),
    "fields": st.lists(st.sampled_from(["body", "title^2", "body^1e308", "^3", "", "body^-1"]), max_size=40),
    "combine": st.sampled_from(["replace", "linear", "rrf", "sum", ""]),
    "weight": NUMBERS,
    "rank_constant": st.one_of(st.integers(-5, 2_000_000), st.sampled_from([2**40, 10**30])),
    "query": st.sampled_from(["t0 t3", "t4", "", "T0 t9 t1"]),
    "window_size": st.one_of(st.integers(min_value=-5, max_value=20_000), st.sampled_from([2**40, 10**30])),
    "alpha": NUMBERS,
    "beta": NUMBERS,
    "k1": NUMBERS,
    "b": NUMBERS,
    "normalize": st.sampled_from(["none", "paper", "reference", "x"]),
    "min_score": NUMBERS,
    "mode": st.sampled_from(["bmx", "bm25", "BMX", ""]),
    "augment": st.one_of(
        st.fixed_dictionaries(
            {"queries": st.lists(st.sampled_from(["t0", "t3 t4", "", "x"]), max_size=6)},
            optional={"weights": st.lists(NUMBERS, max_size=6)},
        ),
        st.builds(lambda n: {"queries": ["t0"] * n, "weights": [0.1] * n}, st.integers(0, 3000)),
    ),
    "wqa_mode": st.sampled_from(["merged", "sum", "none"]),
    "widen": st.booleans(),
    "explain": st.booleans(),
    "deadline": st.one_of(NUMBERS, st.sampled_from([0.001, 5, "1s"])),
}


@st.composite
def bmx_section(draw: st.DrawFn) -> Any:
    """`ext.bmx`: mostly plausible keys with edge values, sometimes wrong types or unknown keys."""
    keys = draw(st.lists(st.sampled_from(BMX_KEYS), unique=True, max_size=len(BMX_KEYS)))
    out: dict[str, Any] = {"field": "body"} if draw(st.booleans()) else {}
    for key in keys:
        out[key] = draw(st.one_of(GOOD_VALUES[key], GOOD_VALUES[key], WILD))
    if draw(st.integers(0, 9)) == 0:
        out[draw(st.text(min_size=1, max_size=8))] = draw(WILD)
    if draw(st.integers(0, 9)) == 0:
        return draw(WILD)  # not even an object
    return out


@st.composite
def search_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if draw(st.booleans()):
        body["query"] = draw(
            st.one_of(
                st.just({"match": {"body": "t0 t3"}}),
                st.builds(lambda t: {"match": {"body": t}}, st.text(max_size=30)),
                st.builds(
                    lambda t: {"multi_match": {"query": t, "fields": ["body", "title"]}}, st.text(max_size=10)
                ),
                WILD,
            )
        )
    for key in ("from", "size"):
        if draw(st.integers(0, 3)) == 0:
            body[key] = draw(st.one_of(st.integers(-3, 20_000), WILD))
    if draw(st.integers(0, 5)) == 0:
        body[
            draw(st.sampled_from(["sort", "search_after", "pit", "aggs", "rescore", "track_total_hits"]))
        ] = draw(WILD)
    if draw(st.integers(0, 5)) != 0:
        body["ext"] = {"bmx": draw(bmx_section())}
    elif draw(st.booleans()):
        body["ext"] = draw(WILD)
    return body


def mutate(data: bytes, cuts: list[tuple[int, bytes]]) -> bytes:
    """Broken JSON: bytes replaced at a few positions (invalid UTF-8 included)."""
    out = bytearray(data)
    for pos, junk in cuts:
        if out:
            i = pos % len(out)
            out[i : i + len(junk)] = junk
    return bytes(out)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, allow_nan=False).encode()


@st.composite
def body_bytes(draw: st.DrawFn) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    """A search body and the headers that label it (content type, sometimes an encoding)."""
    kind = draw(
        st.sampled_from(["json", "json", "json", "broken", "nested", "utf8", "ndjson", "empty", "binary"])
    )
    if kind == "json":
        data = _dumps(draw(search_body()))
    elif kind == "broken":
        cuts = draw(
            st.lists(st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=4)), max_size=3)
        )
        data = mutate(_dumps(draw(search_body())), cuts)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    elif kind == "nested":
        depth = draw(st.one_of(st.integers(1, 300), st.integers(240, 270), st.integers(400, 5000)))
        data = nest(depth, draw(st.sampled_from(["bmx", "query", "objects", "bare"])))
    elif kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]))
        data = b'{"query":{"match":{"body":"t0 ' + bad + b'"}},"ext":{"bmx":{"field":"body"}}}'
    elif kind == "ndjson":
        items = draw(
            st.lists(
                st.one_of(
                    st.just({}), st.builds(lambda i: {"index": i}, st.sampled_from(["docs", "x"])), WILD
                ),
                max_size=4,
            )
        )
        lines = []
        for header in items:
            lines += [_dumps(header), _dumps(draw(search_body()))]
        data = b"\n".join(lines) + b"\n"
        if draw(st.booleans()):
            data = mutate(data, [(draw(st.integers(0, 1000)), b"\n{")])
    elif kind == "binary":
        data = draw(st.binary(max_size=200))
    else:
        data = b""
    headers: list[tuple[str, str]] = [
        (
            "Content-Type",
            draw(
                st.sampled_from(
                    [
                        "application/json",
                        "application/x-ndjson",
                        "text/plain",
                        "application/vnd.elasticsearch+json; compatible-with=8",
                    ]
                )
            ),
        )
    ]
    encoding = draw(st.sampled_from(["", "", "", "gzip", "gzip-lie", "deflate", "br"]))
    if encoding == "gzip":
        data = gzip.compress(data)
        headers.append(("Content-Encoding", "gzip"))
    elif encoding == "gzip-lie":
        headers.append(("Content-Encoding", "gzip"))  # says gzip, is not
    elif encoding == "deflate":
        data = zlib.compress(data)
        headers.append(("Content-Encoding", "deflate"))
    elif encoding == "br":
        headers.append(("Content-Encoding", "br"))
    if draw(st.integers(0, 4)) == 0:
        headers.append(
            (
                draw(st.sampled_from(["Accept", "Authorization", "X-Opaque-Id", "Accept-Encoding"])),
                draw(st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)),
            )
        )
    return data, tuple(headers)


SEGMENT = st.sampled_from(
    [
        "docs",
        "docs-*",
        "docs,other",
        "other",
        "_all",
        "*",
        "%2e%2e",
        "..",
        "",
        "_bmx",
        "d%C3%A9",
        "%ff",
        "a b",
    ]
)
ENDPOINT = st.sampled_from(
    ["_search", "_search", "_msearch", "_count", "_doc/1", "_bulk", "_bmx/health", "_bmx/metrics", ""]
)
QUERY = st.sampled_from(
    [
        "",
        "",
        "?size=3",
        "?from=2&size=2",
        "?size=-1",
        "?size=x",
        "?pretty",
        "?filter_path=hits.hits._id",
        "?format=yaml",
        "?from=99999&size=1",
        "?%zz",
        "?q=t0&size=2",
    ]
)


@st.composite
def targets(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(
            st.sampled_from(
                [
                    "*",
                    "http://127.0.0.1:1/docs/_search",
                    "//docs/_search",
                    "/docs/_search#frag",
                    "docs/_search",
                    "/docs//_search",
                    "/%00/_search",
                    "/docs/_search/../../_bulk",
                ]
            )
        )
    segments = draw(st.lists(SEGMENT, max_size=2))
    return "/" + "/".join([*segments, draw(ENDPOINT)]) + draw(QUERY)


METHODS = st.sampled_from(["POST", "POST", "POST", "GET", "GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])


@st.composite
def requests(draw: st.DrawFn) -> Raw:
    """Any request a client could send: mostly searches, with every kind of bad body."""
    method = draw(st.one_of(METHODS, st.sampled_from(["post", "get", "FOO", "M-SEARCH", "CONNECT", "TRACE"])))
    data, headers = draw(body_bytes())
    framing = draw(st.sampled_from(["length", "length", "length", "chunked", "none", "both"]))
    if framing == "none":
        data = b""
    return Raw(method, draw(targets()), headers, data, framing)
