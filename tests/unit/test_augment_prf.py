"""Augmentation providers: reading `ext.bmx.augment`, and PRF's expansion terms from the window."""

from __future__ import annotations

import numpy as np
import pytest

from bmx_rerank.errors import SearchError
from bmx_rerank.policy import PolicyError, parse_rule
from bmx_rerank.rerank.augment import Augment, feedback_terms, parse_augment
from bmx_rerank.rerank.spec import parse_spec
from bmx_rerank.stats.corpus import CorpusStats
from bmx_rerank.upstream import DocRef, DocTerms


def doc(i: int, tf: dict[str, int]) -> DocTerms:
    return DocTerms(DocRef("ix", str(i)), True, tf)


def test_given_queries_stay_as_they_were():
    got = parse_augment({"queries": ["a b", "c"], "weights": [0.5, 1]}, "bmx")
    assert got == Augment(("a b", "c"), (0.5, 1.0))
    assert parse_augment({"queries": ["a"]}, "bmx").weights == (1.0,)


def test_a_provider_and_its_options_are_read():
    got = parse_augment({"provider": "prf", "docs": 5, "terms": 8, "weight": 0.2}, "bmx")
    assert (got.provider, got.docs, got.terms, got.weight) == ("prf", 5, 8, 0.2)
    assert parse_augment("llm", "policy").provider == "llm"
    spec = parse_spec({"field": "body", "augment": {"provider": "llm", "count": 3}})
    assert spec.augment.count == 3 and spec.marker()["augment"] == {"provider": "llm", "queries": 0}


@pytest.mark.parametrize(
    "raw",
    [
        {"provider": "oracle"},
        {"provider": "prf", "docs": 0},
        {"provider": "prf", "terms": 1000},
        {"provider": "prf", "weight": -1},
        {"provider": "llm", "queries": ["x"]},
        {"provider": "prf", "docs": True},
        {"queries": ["a"], "weights": [1, 2]},
    ],
)
def test_bad_provider_options_are_400s(raw):
    with pytest.raises(SearchError) as err:
        parse_augment(raw, "bmx")
    assert err.value.status == 400


def test_a_policy_names_a_provider():
    rule = parse_rule("papers=body,augment=prf")
    assert rule.spec.augment.provider == "prf"
    with pytest.raises(PolicyError):
        parse_rule("papers=body,augment=given")


def test_feedback_terms_come_from_the_best_documents_weighted_by_idf():
    docs = [
        doc(0, {"entropy": 2, "ranking": 1, "the": 5, "lexical": 2}),
        doc(1, {"entropy": 1, "lexical": 1, "the": 4, "search": 1}),
        doc(2, {"the": 3, "cooking": 4, "recipes": 2}),
        doc(3, {"the": 3, "cooking": 2, "recipes": 1}),
    ]
    rest = [{"the": 1, "cooking": 1}] * 20 + [{"the": 2}] * 20
    corpus = CorpusStats.from_documents([d.tf for d in docs] + rest)
    scores = np.array([3.0, 2.0, 0.1, 0.0])
    got = feedback_terms(
        corpus, docs, scores, ["entropy"], Augment(provider="prf", docs=2, terms=3, weight=0.5)
    )
    terms = [t for t, _ in got]
    assert terms[0] == "lexical"  # in both feedback documents, rare in the corpus
    assert "entropy" not in terms  # the query's own terms are not expansion terms
    assert "cooking" not in terms and "recipes" not in terms  # only in documents outside the top 2
    assert "the" in terms and dict(got)["the"] < 0.1  # everywhere: in, but far down by idf
    assert got[0][1] == pytest.approx(0.5)  # the best term carries the provider's weight
    assert all(w <= 0.5 for _, w in got)


def test_feedback_terms_of_an_empty_window_are_none():
    corpus = CorpusStats.from_documents([{"a": 1}])
    assert feedback_terms(corpus, [], np.zeros(0), ["a"], Augment(provider="prf")) == []
    docs = [doc(0, {"a": 1, "b": 1})]  # one document: a term needs only be in it
    assert [t for t, _ in feedback_terms(corpus, docs, np.ones(1), ["a"], Augment(provider="prf"))] == []
