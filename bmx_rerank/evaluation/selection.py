"""Honest selection: choose the configuration on some queries, report it on others (k-fold CV).

Queries are shuffled once (seeded) and cut into k folds. For each fold a configuration is chosen on the
other folds (the best mean nDCG@10; with `significance` < 1 only among configurations that beat the
engine there with a one-sided paired t-test at that family-wise level, Bonferroni-corrected) and
measured on that fold alone; the held-out numbers of all folds together are what picking a
configuration this way is worth on new queries.

`cross_validate` alone was the rule before issue 20 (kept for the report and for
benchmarks/eval_resampling.py's side-by-side): apply the best on all queries *if* that held-out number
beats the engine's. One held-out number, without its spread, applied long shots on small query sets
(a configuration chosen on 14 queries lost 5.7 points on the other 21). `select` is the rule now: the
best on all queries is applied only when `gate.decide`'s interval of the procedure's gain on new queries
lies above zero (see `gate`)"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from bmx_rerank.evaluation.gate import DEFAULT_CONFIDENCE, Gate, decide

DEFAULT_SIGNIFICANCE = 1.0  # no gate: the held-out comparison with the engine decides


@dataclass(frozen=True)
class Selection:
    chosen: (
        str  # what --apply stores: `best` below if its held-out number beats the engine's, else the engine
    )
    best: str  # the rule on all queries
    cv_score: float  # mean held-out nDCG@10 of the per-fold choices
    engine_score: float  # the engine's mean over the same queries
    fold_choices: tuple[str, ...]
    per_query: dict[str, float]  # held-out nDCG@10 of the fold's choice, per query
    significance: float = DEFAULT_SIGNIFICANCE
    gate: Gate | None = None  # set by `select`: the evidence behind `chosen`


def folds(queries: Sequence[str], k: int, seed: int = 0) -> list[list[str]]:
    order = sorted(queries)
    random.Random(seed).shuffle(order)
    k = max(2, min(k, len(order)))
    return [order[i::k] for i in range(k)]


def better_than(ours: Sequence[float], engine: Sequence[float], significance: float) -> bool:
    """Whether `ours` beats `engine` query by query: a higher mean and a one-sided paired t-test
    p-value below `significance` (1 or more: any higher mean)."""
    diff = np.asarray(ours, dtype=float) - np.asarray(engine, dtype=float)
    if len(diff) == 0 or diff.mean() <= 1e-12:
        return False
    if significance >= 1.0:
        return True
    if len(diff) < 2:
        return False
    if np.allclose(diff, diff[0]):
        return True  # the same gain on every query: no variance to test, and no doubt either
    return float(stats.ttest_rel(ours, engine, alternative="greater").pvalue) < significance


def best(
    scores: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    queries: Sequence[str],
    engine: str,
    significance: float = DEFAULT_SIGNIFICANCE,
) -> str:
    """The rule: the best mean among configurations beating the engine on `queries`, else the engine."""
    level = significance if significance >= 1.0 else significance / max(1, len(names) - 1)
    base = [scores[engine][q] for q in queries]
    winner, top = engine, float(np.mean(base))
    for name in names:
        if name == engine:
            continue
        values = [scores[name][q] for q in queries]
        mean = float(np.mean(values))
        if mean > top + 1e-12 and better_than(values, base, level):
            winner, top = name, mean
    return winner


def cross_validate(
    scores: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    engine: str,
    k: int = 5,
    seed: int = 0,
    significance: float = DEFAULT_SIGNIFICANCE,
) -> Selection:
    """`scores[name][qid]`: the primary measure per configuration and query."""
    queries = sorted(scores[engine])
    parts = folds(queries, k, seed)
    held: dict[str, float] = {}
    choices = []
    for i, test in enumerate(parts):
        train = [q for j, part in enumerate(parts) if j != i for q in part]
        choice = best(scores, names, train, engine, significance)
        choices.append(choice)
        for q in test:
            held[q] = scores[choice][q]
    cv_score = float(np.mean([held[q] for q in queries]))
    engine_score = float(np.mean([scores[engine][q] for q in queries]))
    winner = best(scores, names, queries, engine, significance)
    return Selection(
        chosen=winner if cv_score > engine_score + 1e-12 else engine,
        best=winner,
        cv_score=cv_score,
        engine_score=engine_score,
        fold_choices=tuple(choices),
        per_query=held,
        significance=significance,
    )


def select(
    scores: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    engine: str,
    k: int = 5,
    seed: int = 0,
    significance: float = DEFAULT_SIGNIFICANCE,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Selection:
    """What `eval` chooses: the best configuration on all queries, applied only when the interval of
    what choosing this way gains on new queries lies above zero (`gate.decide`); the k-fold numbers
    above (`cross_validate`, the rule before the gate) are kept for the report. `significance` below 1
    also asks the winner to beat the engine with a one-sided paired t-test at that family-wise level."""
    sel = cross_validate(scores, names, engine, k, seed, significance)
    gate = decide(scores, names, engine, confidence=confidence, k=k, seed=seed)
    chosen = gate.best if gate.apply else engine
    if chosen != engine and significance < 1.0:
        queries = sorted(scores[engine])
        level = significance / max(1, len(names) - 1)
        ours, base = [scores[chosen][q] for q in queries], [scores[engine][q] for q in queries]
        if not better_than(ours, base, level):
            chosen = engine
    return replace(sel, chosen=chosen, best=gate.best, gate=gate)
