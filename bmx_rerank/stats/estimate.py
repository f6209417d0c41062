"""Estimated mode: raw entropy guessed from df and total term frequency, for indices with no snapshot.

Raw entropy needs every holding document's tf; the cluster only tells how many documents hold a term
(df) and how often it occurs in all (ttf). Given those two, the estimator assumes tf follows the
maximum-entropy distribution on {1, 2, ...} with mean ttf/df, the geometric one:
P(tf = k) = p (1-p)^(k-1), p = df/ttf, and returns df * E[h(sigmoid(tf))]. Real term frequencies are
skewed the same way (most holders use a term once, a few use it a lot), which the even spread
(every holder gets ttf/df, floor/ceil) misses: by convexity the even spread is the smallest raw
entropy consistent with (df, ttf). Both are here; `benchmarks/stats_estimate.py` measures them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

import numpy as np
import orjson

from bmx_rerank.errors import UpstreamError
from bmx_rerank.scoring import entropy_contribution
from bmx_rerank.upstream import Cluster

_K = np.arange(1, 200, dtype=np.float64)
_G = entropy_contribution(_K)


def entropy_geometric(df: np.ndarray, ttf: np.ndarray) -> np.ndarray:
    """df * E[h(sigmoid(tf))] with tf ~ Geometric(p = df/ttf) on {1, 2, ...} (tf = 1 when ttf <= df)."""
    df = np.asarray(df, dtype=np.float64)
    ttf = np.maximum(np.asarray(ttf, dtype=np.float64), df)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(ttf > 0, df / ttf, 1.0)
    q = 1.0 - p
    # P(k) = p q^(k-1); the sum is truncated where h(sigmoid(k)) underflows to 0 (k > 36).
    probs = p[:, None] * np.power(q[:, None], _K[None, :] - 1.0)
    return df * (probs @ _G)


def entropy_even(df: np.ndarray, ttf: np.ndarray) -> np.ndarray:
    """ttf spread as evenly as possible over df holders: r of them hold floor(ttf/df)+1, the rest floor."""
    df = np.asarray(df, dtype=np.int64)
    ttf = np.maximum(np.asarray(ttf, dtype=np.int64), df)
    safe = np.maximum(df, 1)
    low = ttf // safe
    extra = ttf - low * safe
    est = (df - extra) * entropy_contribution(low) + extra * entropy_contribution(low + 1)
    return np.where(df > 0, est, 0.0)


ESTIMATORS = {"geometric": entropy_geometric, "even": entropy_even}
DEFAULT_ESTIMATOR = "geometric"


# --- the cluster reads behind the estimated mode -------------------------------------------------


async def estimate_base(
    cluster: Cluster,
    index_expr: str,
    indices: Sequence[str],
    field: str,
    headers: Mapping[str, str],
) -> tuple[int, int]:
    """N (live documents with the field, all shards; unlike a snapshot's N this includes documents whose
    value analyzes to no token: the exact count would need a `*` wildcard over the whole vocabulary on
    every check) and an estimated total length: N times the
    average length Lucene's field statistics give on one shard (shard-local, deleted documents
    included, hence an estimate)."""
    count_body = {"query": {"exists": {"field": field}}}
    n_docs = int(
        (await cluster.request("POST", f"/{quote(index_expr, safe=',*')}/_count", count_body, headers))[
            "count"
        ]
    )
    body = {
        "doc": {field: "x"},
        "fields": [field],
        "field_statistics": True,
        "term_statistics": False,
        "positions": False,
        "offsets": False,
    }
    tv = await cluster.request("POST", f"/{quote(indices[0])}/_termvectors", body, headers)
    fstats = tv.get("term_vectors", {}).get(field, {}).get("field_statistics") or {}
    doc_count, sum_ttf = fstats.get("doc_count", 0), fstats.get("sum_ttf", 0)
    avgdl = sum_ttf / doc_count if doc_count > 0 and sum_ttf > 0 else 1.0
    return n_docs, int(round(avgdl * n_docs))


async def estimate_terms(
    cluster: Cluster,
    index_expr: str,
    indices: Sequence[str],
    field: str,
    terms: Sequence[str],
    headers: Mapping[str, str],
) -> dict[str, tuple[int, float]]:
    """Per term: exact live df over all shards (`_msearch` of term counts) and an estimated ttf = df times
    the mean tf one shard's term statistics give (the artificial-document `_termvectors` trick)."""
    lines = []
    for term in terms:
        lines.append(orjson.dumps({"index": index_expr}))
        lines.append(orjson.dumps({"size": 0, "track_total_hits": True, "query": {"term": {field: term}}}))
    answer = await cluster.post_ndjson("/_msearch", lines, headers, "bmx_estimate_exception")
    answers = answer["responses"]
    df = {}
    for term, ans in zip(terms, answers, strict=True):
        if "error" in ans:
            err = ans["error"]
            raise UpstreamError(
                ans.get("status", 500), err.get("type", "bmx_estimate_exception"), err.get("reason", "")
            )
        df[term] = int(ans["hits"]["total"]["value"])
    ratio: dict[str, float] = {}
    body_tv = {
        # The terms are already analyzed: split them on whitespace only, so a stemming analyzer
        # cannot turn them into other terms before their statistics are looked up.
        "doc": {field: " ".join(terms)},
        "per_field_analyzer": {field: "whitespace"},
        "fields": [field],
        "term_statistics": True,
        "field_statistics": False,
        "positions": False,
        "offsets": False,
    }
    tv = await cluster.request("POST", f"/{quote(indices[0])}/_termvectors", body_tv, headers)
    for term, data in (tv.get("term_vectors", {}).get(field, {}).get("terms") or {}).items():
        d, t = data.get("doc_freq", 0), data.get("ttf", 0)
        if d and t:
            ratio[term] = t / d
    return {term: (df[term], df[term] * ratio.get(term, 1.0)) for term in terms}
