"""Widening the first stage: what the cluster is asked for so the window holds the right candidates.

Augmented queries (WQA) may match documents the original query misses; BMX can only rescore what the
window holds, so they join the upstream query as `bool.should` clauses beside the original query, kept
whole. The original's top-level `filter` and `must_not` are repeated outside the `should`, so an
augmented match passes them too: widening never lets a filtered-out document in, and never drops a
document the original query returned (each of those matches the original, the first `should`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

OUTER_CLAUSES = ("filter", "must_not")


def text_clause(fields: str | Sequence[str], text: str) -> dict[str, Any]:
    """`text` matched on the field (or fields, as `multi_match`): the first stage for a request that
    names only `ext.bmx.query`, and the clause of an augmented query."""
    names = [fields] if isinstance(fields, str) else list(fields)
    if len(names) == 1:
        return {"match": {names[0]: {"query": text}}}
    return {"multi_match": {"query": text, "fields": names}}


def widen(
    query: Mapping[str, Any] | None, fields: str | Sequence[str], augmented: Sequence[str]
) -> dict[str, Any] | None:
    """`query` OR a match on the fields for each augmented query, keeping its filters as filters."""
    extra = [text_clause(fields, text) for text in augmented if text.strip()]
    if not extra:
        return None if query is None else dict(query)
    if query is None:
        return {"bool": {"should": extra, "minimum_should_match": 1}}
    body = query.get("bool") if len(query) == 1 else None
    outer = {k: body[k] for k in OUTER_CLAUSES if k in body} if isinstance(body, Mapping) else {}
    return {"bool": {**outer, "should": [dict(query), *extra], "minimum_should_match": 1}}
