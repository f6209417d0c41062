"""Widening the first stage: what the cluster is asked for so the window holds the right candidates.

Augmented queries (WQA) may match documents the original query misses; BMX can only rescore what the
window holds, so their terms join the upstream query as `bool.should` clauses. Filters and exclusions of
the original stay outside the `should`, so widening never lets a filtered-out document in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OUTER_CLAUSES = ("filter", "must_not")


def match_clause(field: str, text: str) -> dict[str, Any]:
    """A plain match query on the field: the first stage for a request that names only `ext.bmx.query`."""
    return {"match": {field: {"query": text}}}


def widen(query: Mapping[str, Any] | None, field: str, augmented: Sequence[str]) -> dict[str, Any] | None:
    """`query` OR a match on `field` for each augmented query, keeping its filters as filters."""
    extra = [match_clause(field, text) for text in augmented if text.strip()]
    if not extra:
        return None if query is None else dict(query)
    if query is None:
        return {"bool": {"should": extra, "minimum_should_match": 1}}
    outer: dict[str, Any] = {}
    inner: Mapping[str, Any] = query
    body = query.get("bool") if len(query) == 1 else None
    if isinstance(body, Mapping) and any(k in body for k in OUTER_CLAUSES):
        outer = {k: body[k] for k in OUTER_CLAUSES if k in body}
        rest = {k: v for k, v in body.items() if k not in OUTER_CLAUSES}
        scoring = {k: v for k, v in rest.items() if k in ("must", "should")}
        inner = {"bool": rest} if scoring else {"match_all": {}}
        if not scoring:  # a pure filter: the augmented matches still have to pass it, nothing to OR with
            return {"bool": {**outer, "should": extra, "minimum_should_match": 1}}
    return {"bool": {**outer, "should": [dict(inner), *extra], "minimum_should_match": 1}}
