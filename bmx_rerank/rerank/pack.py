"""Packing the answer: the upstream response with the window reordered, rescored and sliced.

Everything but the hits' order, `_score`, `max_score` and the marker is left as the cluster sent it
(aggregations, `hits.total`, highlight, `_source`, `fields`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.rescore import Scored

SEQ_FIELDS = ("_seq_no", "_primary_term")


def ranking(scores: np.ndarray, min_score: float | None) -> list[int]:
    """Window positions by descending score (ties keep the cluster's order), below `min_score` dropped."""
    order = np.argsort(-scores, kind="stable")
    if min_score is not None:
        order = order[scores[order] >= min_score]
    return [int(i) for i in order]


def pack(
    response: Mapping[str, Any], scored: Scored, plan: Plan, marker: Mapping[str, Any]
) -> dict[str, Any]:
    """The reranked answer: hits from..from+size of the rescored window."""
    assert plan.spec is not None
    out = dict(response)
    hits_obj = dict(out.get("hits", {}))
    hits = list(hits_obj.get("hits", []))
    order = ranking(scored.scores, plan.spec.min_score)
    page = []
    for i in order[plan.from_ : plan.from_ + plan.size]:
        hit = _strip(hits[i], plan.wants_seq_no)
        hit["_score"] = float(scored.scores[i])
        if plan.spec.explain:
            hit["_bmx_explanation"] = explanation(scored, i, plan.spec.mode)
        page.append(hit)
    hits_obj["hits"] = page
    hits_obj["max_score"] = float(scored.scores[order[0]]) if order else None
    out["hits"] = hits_obj
    out["_bmx"] = dict(marker)
    return out


def fallback(response: Mapping[str, Any], plan: Plan, marker: Mapping[str, Any]) -> dict[str, Any]:
    """The answer when reranking failed: the cluster's own order and scores, paged the same way."""
    out = dict(response)
    hits_obj = dict(out.get("hits", {}))
    hits = hits_obj.get("hits", [])
    hits_obj["hits"] = [_strip(h, plan.wants_seq_no) for h in hits[plan.from_ : plan.from_ + plan.size]]
    out["hits"] = hits_obj
    out["_bmx"] = dict(marker)
    return out


def explanation(scored: Scored, row: int, mode: str) -> dict[str, Any]:
    """Per-term breakdown of one hit's score: each live query token's contribution."""
    return {
        "value": float(scored.scores[row]),
        "description": f"{mode} score, sum of per-token contributions",
        "details": [
            {
                "token": lab.token,
                "query": lab.query,
                "weight": lab.weight,
                "value": float(scored.parts[row, j]),
            }
            for j, lab in enumerate(scored.labels)
        ],
    }


def _strip(hit: Mapping[str, Any], keep_seq: bool) -> dict[str, Any]:
    return dict(hit) if keep_seq else {k: v for k, v in hit.items() if k not in SEQ_FIELDS}
