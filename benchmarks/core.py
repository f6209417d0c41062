"""Time the scoring core: windows of 100/1000/10000 candidates x queries of 5/20/200 tokens.

Run: .venv/bin/python -m benchmarks.core
Prints a Markdown table (median and p95 of repeated calls of `scoring.score`, validation included).
Long queries stand for WQA: an original query plus augmentations merged into one token list.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from bmx_rerank import scoring

WINDOWS = (100, 1000, 10000)
QUERY_LENGTHS = (5, 20, 200)


def inputs(n: int, m: int, rng: np.random.Generator):
    """A window of n candidates for an m-token query over m/2 distinct terms (duplicates, as WQA makes)."""
    u = max(1, m // 2)
    n_docs = 1_000_000
    df = rng.integers(1, 50_000, u).astype(float)
    stats = scoring.TermStats(n_docs, 120.0, df, df * rng.uniform(0.05, 0.23, u))
    tf = rng.poisson(0.5, (n, u)).astype(float)
    length = rng.integers(20, 400, n).astype(float)
    tokens = rng.integers(0, u, m)
    weights = np.where(np.arange(m) < 5, 1.0, rng.uniform(0.1, 1.0, m))
    return stats, scoring.Candidates(tf, length), [scoring.Query(tokens, weights)]


def measure(n: int, m: int, mode: str, repeats: int) -> tuple[float, float]:
    stats, cands, queries = inputs(n, m, np.random.default_rng(n * 1000 + m))
    request = scoring.Request(mode=mode)
    scoring.score(stats, cands, queries, request)  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        scoring.score(stats, cands, queries, request)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3, float(np.percentile(times, 95)) * 1e3


def main() -> None:
    print(f"numpy {np.__version__}, Python {platform.python_version()}, {platform.machine()}")
    print("| mode | window | query tokens | median ms | p95 ms |")
    print("|---|---|---|---|---|")
    for mode in ("bmx", "bm25"):
        for n in WINDOWS:
            for m in QUERY_LENGTHS:
                repeats = 200 if n * m <= 200_000 else 30
                med, p95 = measure(n, m, mode, repeats)
                print(f"| {mode} | {n} | {m} | {med:.3f} | {p95:.3f} |")


if __name__ == "__main__":
    main()
