"""Packing the answer: the upstream response with the window reordered, rescored and sliced.

Everything but the hits' order, `_score`, `max_score` and the marker is left as the cluster sent it
(aggregations, `hits.total`, highlight, `_source`, `fields`).

How the text score meets the first stage's (`ext.bmx.combine`), within the window:

- `replace` (and no `combine`): the BMX score alone. A hit no text clause matched (a knn-only hit, a
  fuzzy or wildcard expansion the analysed text does not hold) has no BMX score: it is kept, below
  every matched hit, in the cluster's order, with `_score` 0.0, and counted as `unmatched` in the
  marker. A window where nothing matched is not reranked at all (see `pipeline`).
- `linear`: weight x minmax(first-stage `_score`) + (1 - weight) x minmax(BMX), each min-max
  normalized over the window ((s - min) / (max - min)), as Elasticsearch's linear retriever with its
  `minmax` normalizer; all 0 when max = min (Elasticsearch keeps the raw score there, off the scale).
- `rrf`: sum over the two rankings of 1 / (rank_constant + rank), ranks from 1, as Elasticsearch's
  RRF retriever: the first stage's window order is one ranking, the BMX order of the matched hits the
  other (an unmatched hit is absent from it, as from a text retriever's results)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bmx_rerank.rerank.plan import Plan
from bmx_rerank.rerank.query import Text
from bmx_rerank.rerank.rescore import Folded, Scored

SEQ_FIELDS = ("_seq_no", "_primary_term")
COMBINES = ("replace", "linear", "rrf")


def ranking(scores: np.ndarray, min_score: float | None) -> list[int]:
    """Window positions by descending score (ties keep the cluster's order), below `min_score` dropped."""
    order = np.argsort(-scores, kind="stable")
    if min_score is not None:
        order = order[scores[order] >= min_score]
    return [int(i) for i in order]


def minmax(scores: np.ndarray) -> np.ndarray:
    """(s - min) / (max - min) over the window; all 0 when every score is the same."""
    if scores.size == 0:
        return scores
    low, high = float(scores.min()), float(scores.max())
    return (scores - low) / (high - low) if high > low else np.zeros_like(scores)


def rrf(first: np.ndarray, text: np.ndarray, matched: np.ndarray, rank_constant: int) -> np.ndarray:
    """Reciprocal rank fusion of the first stage's order (`first`, the window as it came) and the
    text order of the matched hits."""
    n = first.shape[0]
    out = 1.0 / (rank_constant + np.arange(1, n + 1, dtype=np.float64))
    order = [i for i in np.argsort(-text, kind="stable") if matched[i]]
    for rank, i in enumerate(order, start=1):
        out[i] += 1.0 / (rank_constant + rank)
    return out


def combine(
    first: np.ndarray, text: np.ndarray, matched: np.ndarray, how: str, weight: float, rank_constant: int
) -> tuple[np.ndarray, np.ndarray]:
    """(final scores, sort keys) of the window under `how`; see the module docstring."""
    if how == "linear":
        final = weight * minmax(first) + (1.0 - weight) * minmax(text)
        return final, final
    if how == "rrf":
        final = rrf(first, text, matched, rank_constant)
        return final, final
    if how != "replace":
        raise ValueError(f"combine must be one of {COMBINES}, got {how!r}")
    final = np.where(matched, text, 0.0)
    # Unmatched hits below every matched one, whatever the scores (a matched BMX score is > 0 anyway).
    return final, np.where(matched, final, -np.inf)


def pack(
    response: Mapping[str, Any],
    hits: Sequence[dict[str, Any]],
    first: np.ndarray,
    tree: Folded,
    plan: Plan,
    marker: Mapping[str, Any],
) -> dict[str, Any]:
    """The reranked answer: hits from..from+size of the rescored window (`hits`: the window's hits
    still alive, in the cluster's order, one per row of `tree`; `first`: their `_score`s,
    `HitColumns.first`)."""
    spec = plan.spec
    assert spec is not None
    how = getattr(spec, "combine", None) or "replace"
    final, keys = combine(
        first,
        tree.scores,
        tree.matched,
        how,
        float(getattr(spec, "weight", 0.5)),
        int(getattr(spec, "rank_constant", 60)),
    )
    ranked = np.argsort(-keys, kind="stable")
    if spec.min_score is not None:
        ranked = ranked[final[ranked] >= spec.min_score]
    order = ranked.tolist()
    out = dict(response)
    hits_obj = dict(out.get("hits", {}))
    page = []
    keep_version = wants_version(plan)
    for i in order[plan.from_ : plan.from_ + plan.size]:
        hit = strip(hits[i], plan.wants_seq_no, keep_version)
        hit["_score"] = float(final[i])
        if spec.explain:
            hit["_bmx_explanation"] = _combined_explanation(
                how, tree, i, spec.mode, float(final[i]), float(first[i])
            )
        page.append(hit)
    hits_obj["hits"] = page
    hits_obj["max_score"] = float(final[order[0]]) if order else None
    out["hits"] = hits_obj
    out["_bmx"] = {**marker, "unmatched": int((~tree.matched).sum())}
    return out


def fallback(response: Mapping[str, Any], plan: Plan, marker: Mapping[str, Any]) -> dict[str, Any]:
    """The answer when reranking failed or was declined: the cluster's own order and scores, paged."""
    out = dict(response)
    hits_obj = dict(out.get("hits", {}))
    hits = hits_obj.get("hits", [])
    hits_obj["hits"] = [
        strip(h, plan.wants_seq_no, wants_version(plan)) for h in hits[plan.from_ : plan.from_ + plan.size]
    ]
    out["hits"] = hits_obj
    out["_bmx"] = dict(marker)
    return out


def explanation(scored: Scored, row: int, mode: str) -> dict[str, Any]:
    """Per-term breakdown of one hit's score on one field: each live query token's contribution."""
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


def tree_explanation(tree: Folded, row: int, mode: str) -> dict[str, Any]:
    """One hit's score as the tree folds it: a leaf's per-token breakdown on its field (boost applied
    on top), a node's parts with how they combine."""
    node = tree.node
    if isinstance(node, Text):
        assert tree.leaf is not None
        inner = explanation(tree.leaf, row, mode)
        inner.update(field=node.field, text=node.text)
        if node.boost == 1.0:
            return inner
        return {
            "value": float(tree.scores[row]),
            "description": f"boost {node.boost:g} x",
            "details": [inner],
        }
    rule = "sum of" if node.how == "sum" else f"max plus {node.tie_breaker:g} x the others of"
    boost = "" if node.boost == 1.0 else f"boost {node.boost:g} x "
    return {
        "value": float(tree.scores[row]),
        "description": f"{boost}{rule}",
        "details": [tree_explanation(child, row, mode) for child in tree.children],
    }


def _combined_explanation(
    how: str, tree: Folded, row: int, mode: str, final: float, first: float
) -> dict[str, Any]:
    text = tree_explanation(tree, row, mode)
    if how == "replace":
        return text if tree.matched[row] else {**text, "description": "no text clause matched"}
    return {
        "value": final,
        "description": f"{how} of the first stage and {mode} (see combine in docs/proxy.md)",
        "details": [{"value": first, "description": "first-stage _score"}, text],
    }


def wants_version(plan: Plan) -> bool:
    """Whether the caller asked for `_version` (the window always asks for it, see `pipeline`)."""
    value = plan.params.get("version")
    return (plan.body or {}).get("version") is True or (value is not None and value.lower() in ("", "true"))


def strip(hit: Mapping[str, Any], keep_seq: bool, keep_version: bool = True) -> dict[str, Any]:
    """A hit without the version fields the window asked for and the caller did not."""
    drop = (() if keep_seq else SEQ_FIELDS) + (() if keep_version else ("_version",))
    return {k: v for k, v in hit.items() if k not in drop}
