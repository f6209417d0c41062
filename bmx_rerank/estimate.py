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

import numpy as np

from bmx_rerank.scoring import entropy_contribution

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
