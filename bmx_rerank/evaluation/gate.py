"""Applying only what holds on new queries: the selection procedure's gain, priced with its uncertainty.

What `--apply` would store is the *result of a procedure*: run every configuration on the judged
queries, take the best mean. Its gain on new queries is not the winner's gain on the queries it won on
(the best of a dozen flatters itself), so it is estimated the honest way, choosing inside and measuring
outside:

- **Expected gain** (nested cross-validation, repeated): queries are cut into `k` folds; for each fold
  the best configuration on the other folds is chosen and its difference to the engine measured on that
  fold alone. Averaged over `repeats` shuffles, so the number does not hinge on one split. Every
  configuration compared takes part in every choice, so the more are compared, the more a lucky one
  costs here: the estimate accounts for the size of the grid.
- **Interval** (a bootstrap of the whole choice): the judged queries are resampled with replacement,
  and the same cross-validated choice is re-run on each resample (a query drawn twice stays in one fold,
  never on both sides of a choice). The spread of those re-run estimates, centred on the expected gain,
  is the interval at `confidence` (two-sided: 90 % leaves 5 % on each side), and the share of them
  below zero the chance that applying loses. (`method="queries"` resamples the held-out per-query
  differences instead, the choices as made: about half as wide, but blind to how unstable the choice
  is, it applies the best of eight pure-noise configurations in 8-19 % of draws where the whole
  choice's interval applies it in 0-1 %; benchmarks/eval_resampling.py compares the two on real data.)
- **The rule**: the best configuration on all queries is applied only when it is not the engine, the
  interval's lower bound is above zero, and the queries it changes say the same: a one-sided sign test
  of the queries it ranks better against those it ranks worse, at the interval's tail ((1 - confidence)
  / 2). A bootstrap cannot see losses the sample does not hold: a configuration that changes 2 of 15
  queries, both for the better, has no resample below zero, yet 2-0 is a coin's p = 0.25 (on SciFact
  with titles apart, BMX changes 16 % of the queries and loses 0.56 on all of them, and was applied
  that way on 12 % of 15-query draws before this test). Otherwise the engine's own ranking stays, and
  `reason` says why in words.
- **More queries**: the interval narrows about as 1/sqrt(n), so `n x (half-width / expected)^2` queries
  would put its bound at zero: a rough number of judged queries that would settle the question either way.

All of it runs on per-query numbers (numpy, seeded), so the same decision can be recomputed from stored
scores (`benchmarks/eval_resampling.py` does, on thousands of draws)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy import stats

from bmx_rerank import defaults

DEFAULT_CONFIDENCE = defaults.EVAL_CONFIDENCE
DEFAULT_BOOTSTRAP = 1000
DEFAULT_REPEATS = 20
HURT_SHOWN = 5
TIE = 1e-12


@dataclass(frozen=True)
class Gate:
    """The evidence behind applying (or not) the best configuration; gains in nDCG@10 (0..1)."""

    best: str  # the best mean on all queries (the engine when nothing beats it)
    apply: bool  # whether `best` is applied
    queries: int
    compared: int  # configurations compared, the engine included
    expected: float  # expected gain over the engine on new queries (nested cross-validation)
    low: float  # the interval at `confidence`
    high: float
    confidence: float
    p_loss: float  # chance that applying the procedure's choice loses to the engine
    more_queries: int | None  # roughly how many more judged queries would settle it (None: no telling)
    in_sample: float  # `best`'s own gain on the queries it was chosen on (optimistic)
    wins: int = 0  # queries `best` ranks better than the engine, and worse
    losses: int = 0
    sign_p: float = 1.0  # one-sided sign test of wins against losses (ties left out)
    hurt: tuple[tuple[str, float], ...] = ()  # (query id, change) where `best` loses most
    reason: str = ""

    def to_json(self, texts: Mapping[str, str] | None = None) -> dict[str, Any]:
        out = asdict(self)
        for key in ("expected", "low", "high", "p_loss", "in_sample", "sign_p"):
            out[key] = round(out[key], 6)
        out["hurt"] = [
            {"query": q, "text": (texts or {}).get(q, ""), "change": round(d, 6)} for q, d in self.hurt
        ]
        return out


def _matrix(
    scores: Mapping[str, Mapping[str, float]], names: Sequence[str], engine: str, queries: Sequence[str]
) -> np.ndarray:
    """Rows: the engine first, then the other names; columns: queries."""
    order = [engine] + [n for n in names if n != engine]
    return np.array([[scores[n][q] for q in queries] for n in order], dtype=np.float64)


def _choose(means: np.ndarray) -> int:
    """Row of the best mean; the engine (row 0) unless something beats it (ties go to the engine, and
    among the others to the first)."""
    best = int(np.argmax(means))
    return best if means[best] > means[0] + TIE else 0


def _cv_gain(
    m: np.ndarray, weights: np.ndarray, labels: np.ndarray, k: int, held: np.ndarray | None = None
) -> float:
    """Weighted mean held-out gain over the engine of choosing on the other folds; `labels` assign each
    query (column) a fold, -1 for a query not in the sample. `held`, if given, receives each query's
    held-out difference."""
    total = 0.0
    for fold in range(k):
        test = labels == fold
        if not test.any():
            continue
        train = (labels >= 0) & ~test
        w = weights * train
        if w.sum() <= 0:
            choice = 0
        else:
            choice = _choose(m @ w / w.sum())
        total += float(((m[choice] - m[0]) * weights * test).sum())
        if held is not None:
            held[test] = (m[choice] - m[0])[test]
    return total / float(weights.sum())


def _labels(present: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Folds for the queries present: shuffled, then dealt round robin (at most as many folds as queries)."""
    labels = np.full(present.shape[0], -1)
    idx = np.flatnonzero(present)
    rng.shuffle(idx)
    labels[idx] = np.arange(idx.size) % max(2, min(k, idx.size))
    return labels


def nested_cv(m: np.ndarray, k: int, repeats: int, rng: np.random.Generator) -> np.ndarray:
    """Each query's held-out gain of the choice over the engine, averaged over `repeats` fold splits
    (their mean: the expected gain)."""
    n = m.shape[1]
    ones, present = np.ones(n), np.ones(n, dtype=bool)
    held, out = np.zeros(n), np.zeros(n)
    for _ in range(repeats):
        _cv_gain(m, ones, _labels(present, k, rng), k, held)
        out += held
    return out / repeats


def bootstrap_cv(m: np.ndarray, k: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """The cross-validated gain re-run on `draws` resamples of the queries (with replacement)."""
    n = m.shape[1]
    out = np.empty(draws)
    for b in range(draws):
        weights = np.bincount(rng.integers(0, n, n), minlength=n).astype(np.float64)
        out[b] = _cv_gain(m, weights, _labels(weights > 0, k, rng), k)
    return out


def more_queries(n: int, expected: float, low: float, high: float) -> int | None:
    """Roughly how many more judged queries would move the interval's near bound past zero (0: settled)."""
    if low > 0 or high < 0:
        return 0
    if abs(expected) <= TIE:
        return None  # no gain to find either way
    half = (expected - low) if expected > 0 else (high - expected)
    return max(1, math.ceil(n * (half / abs(expected)) ** 2 - n))


def decide(
    scores: Mapping[str, Mapping[str, float]],
    names: Sequence[str],
    engine: str,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    k: int = 5,
    repeats: int = DEFAULT_REPEATS,
    draws: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    method: str = "choice",
) -> Gate:
    """`scores[name][qid]`: the primary measure per configuration and query. The rule (module doc)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if method not in ("choice", "queries"):
        raise ValueError(f"method must be 'choice' or 'queries', got {method!r}")
    queries = sorted(scores[engine])
    order = [engine] + [n for n in names if n != engine]
    m = _matrix(scores, names, engine, queries)
    n = len(queries)
    best_row = _choose(m.mean(axis=1)) if n else 0
    best = order[best_row]
    diff = m[best_row] - m[0]
    hurt = tuple(
        (queries[i], float(diff[i])) for i in np.argsort(diff, kind="stable")[:HURT_SHOWN] if diff[i] < -TIE
    )
    in_sample = float(diff.mean()) if n else 0.0
    if len(order) < 2 or n < 2:
        expected = low = high = 0.0
        p_loss = 0.0
    else:
        rng = np.random.default_rng(seed)
        held = nested_cv(m, k, repeats, rng)
        expected = float(held.mean())
        if method == "choice":
            spread = bootstrap_cv(m, k, draws, rng)
        else:  # "queries": the held-out differences resampled, the choices as made
            spread = held[rng.integers(0, n, (draws, n))].mean(axis=1)
        spread = expected + (spread - spread.mean())  # the bootstrap's spread, centred on the estimate
        tail = (1.0 - confidence) / 2.0
        low, high = (float(x) for x in np.quantile(spread, [tail, 1.0 - tail]))
        p_loss = float((spread < 0).mean())
    wins, losses = int((diff > TIE).sum()), int((diff < -TIE).sum())
    sign_p = float(stats.binomtest(wins, wins + losses, 0.5, alternative="greater").pvalue) if wins else 1.0
    apply = best != engine and low > 0 and sign_p < (1.0 - confidence) / 2.0
    gate = Gate(
        best=best,
        apply=apply,
        queries=n,
        compared=len(order),
        expected=expected,
        low=low,
        high=high,
        confidence=confidence,
        p_loss=p_loss,
        more_queries=more_queries(n, expected, low, high) if n >= 2 and len(order) >= 2 else None,
        in_sample=in_sample,
        wins=wins,
        losses=losses,
        sign_p=sign_p,
        hurt=hurt,
    )
    return _with_reason(gate)


def interval_text(g: Gate) -> str:
    return f"{100 * g.confidence:g} % interval {100 * g.low:+.2f} … {100 * g.high:+.2f}"


def _with_reason(g: Gate) -> Gate:
    what = (
        f"{g.queries} queries, {g.compared} configurations compared, expected {100 * g.expected:+.2f}, "
        f"{interval_text(g)}"
    )
    if g.apply:
        reason = f"applied {g.best}: {what}; chance it loses {100 * g.p_loss:.0f} %"
    elif g.best == "engine" or g.compared < 2:
        reason = f"engine kept: nothing beats it on these queries ({what})"
    elif g.low > 0:
        reason = (
            f"engine kept: not enough evidence: {g.best} changes {g.wins + g.losses} of {g.queries} queries "
            f"({g.wins} better, {g.losses} worse: a sign test gives p = {g.sign_p:.2f}, above "
            f"{(1 - g.confidence) / 2:g}); {what}"
        )
    elif g.expected <= 0:
        reason = (
            f"engine kept: choosing among these configurations does not help on new queries ({what}; "
            f"{g.best} is {100 * g.in_sample:+.2f} on the queries it was chosen on)"
        )
    else:
        more = f"; about {g.more_queries} more judged queries would settle it" if g.more_queries else ""
        reason = f"engine kept: not enough evidence: {what}{more}"
    return replace(g, reason=reason)
