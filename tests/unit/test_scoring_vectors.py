"""Every expected score of `../shared/testvectors/bmx_small.json`, to 1e-9 relative."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from bmx_rerank import scoring
from tests.support.data import VECTORS_FILE

VECTORS = VECTORS_FILE


def load_vectors() -> dict:
    # CI must fail, not skip, when the shared vectors are missing.
    assert VECTORS.is_file(), f"test vectors not found at {VECTORS}"
    return json.loads(VECTORS.read_text())


DATA = load_vectors()


def arrays(corpus: list[list[str]], queries: list[list[str]]):
    """Statistics, candidates (the whole corpus) and token indices, computed from the tokens directly."""
    vocab = sorted({t for doc in corpus for t in doc} | {t for q in queries for t in q})
    index = {t: i for i, t in enumerate(vocab)}
    tf = np.zeros((len(corpus), len(vocab)))
    for row, doc in enumerate(corpus):
        for term, count in Counter(doc).items():
            tf[row, index[term]] = count
    length = tf.sum(axis=1)
    df = (tf > 0).sum(axis=0)
    entropy = np.where(tf > 0, scoring.entropy_contribution(tf), 0.0).sum(axis=0)
    stats = scoring.TermStats(len(corpus), float(length.mean()), df, entropy)
    return (
        stats,
        scoring.Candidates(tf, length),
        [np.array([index[t] for t in q], dtype=int) for q in queries],
    )


def test_corpus_statistics_match_the_vectors():
    stats, _, _ = arrays(DATA["corpus"], [])
    vocab = sorted({t for doc in DATA["corpus"] for t in doc})
    assert stats.n_docs == DATA["stats"]["n_docs"]
    assert stats.avgdl == pytest.approx(DATA["stats"]["avgdl"], rel=1e-12)
    for i, term in enumerate(vocab):
        assert stats.df[i] == DATA["stats"]["df"][term]
        assert stats.entropy[i] == pytest.approx(DATA["stats"]["entropy"][term], rel=1e-9)
    assert scoring.default_alpha(stats.avgdl) == pytest.approx(DATA["defaults"]["alpha"], rel=1e-12)
    assert scoring.default_beta(stats.n_docs) == pytest.approx(DATA["defaults"]["beta"], rel=1e-12)


def _request_and_queries(case: dict):
    queries_tokens = [case["query"], *case.get("augmented", [])]
    stats, cands, token_ids = arrays(DATA["corpus"], queries_tokens)
    weights = [1.0, *case.get("weights", [])]
    queries = [scoring.Query(ids, np.full(len(ids), w)) for ids, w in zip(token_ids, weights, strict=True)]
    kind = case["kind"]
    mode = "bm25" if kind == "bm25" else "bmx"
    wqa = "sum" if kind == "wqa_sum" else "merged"
    extra = {k: case[k] for k in ("alpha", "beta", "k1", "b") if k in case}
    return stats, cands, queries, dict(mode=mode, wqa_mode=wqa, **extra)


CASES = [
    (i, key)
    for i, case in enumerate(DATA["cases"])
    for key in ("scores", "normalized_paper", "normalized_reference")
    if key in case
]


@pytest.mark.parametrize(("case_index", "key"), CASES, ids=[f"case{i}-{k}" for i, k in CASES])
def test_every_case_reproduces_every_score(case_index: int, key: str):
    case = DATA["cases"][case_index]
    stats, cands, queries, options = _request_and_queries(case)
    norm = {"scores": "none", "normalized_paper": "paper", "normalized_reference": "reference"}[key]
    got = scoring.score(stats, cands, queries, scoring.Request(normalize=norm, **options))
    expected = np.array(case[key])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_the_vectors_cover_every_case_kind():
    assert {c["kind"] for c in DATA["cases"]} == {"bmx", "wqa_merged", "wqa_sum", "bm25"}
    assert len(CASES) >= 20
