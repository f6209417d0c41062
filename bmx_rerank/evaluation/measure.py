"""Measuring runs with ir-measures (trec_eval's numbers), and comparing each with the engine's ranking.

nDCG@10 (graded), recall@100 and MRR@10 (relevant: grade >= 1) per query; a query the run returned
nothing for counts 0 (ir-measures, like trec_eval, would skip it and flatter the run). Against the
engine: per-query wins, losses and ties on nDCG@10, and a two-sided paired t-test (scipy)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ir_measures
import numpy as np
from ir_measures import RR, R, nDCG
from scipy import stats

MEASURES = {"nDCG@10": nDCG @ 10, "R@100": R @ 100, "RR@10": RR @ 10}
PRIMARY = "nDCG@10"


def per_query(
    qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """measure name -> {query id: value} for every judged query."""
    out = {name: dict.fromkeys(qrels, 0.0) for name in MEASURES}
    by_measure = {str(m): name for name, m in MEASURES.items()}
    present = {q: dict(docs) for q, docs in run.items() if q in qrels and docs}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), qrels, present):
        out[by_measure[str(metric.measure)]][metric.query_id] = float(metric.value)
    return out


@dataclass(frozen=True)
class Comparison:
    """One configuration against the engine on the same queries."""

    wins: int
    losses: int
    ties: int
    p_value: float  # paired t-test on nDCG@10; 1.0 when the two are identical


def compare(ours: Mapping[str, float], engine: Mapping[str, float], queries: Sequence[str]) -> Comparison:
    a = np.array([ours[q] for q in queries])
    b = np.array([engine[q] for q in queries])
    diff = a - b
    wins, losses = int((diff > 1e-12).sum()), int((diff < -1e-12).sum())
    if not np.any(np.abs(diff) > 1e-12) or len(queries) < 2:
        p = 1.0
    else:
        p = float(stats.ttest_rel(a, b).pvalue)
    return Comparison(wins, losses, len(queries) - wins - losses, p)


def mean(values: Mapping[str, float], queries: Sequence[str]) -> float:
    return float(np.mean([values[q] for q in queries])) if queries else 0.0
