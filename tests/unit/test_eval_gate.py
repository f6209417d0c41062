"""The decision rule of `eval --apply` (issue 20) on synthetic per-query scores: a configuration other
than the engine is applied only when the interval of what choosing gains on new queries lies above zero.
A true gain is found once there are enough queries; no gain is rarely applied; a loss never is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bmx_rerank.evaluation import measure
from bmx_rerank.evaluation.configs import ENGINE, PRIORITY, default_grid, max_compared, shrink
from bmx_rerank.evaluation.gate import decide, more_queries
from bmx_rerank.evaluation.report import Report, Row, plot, table
from bmx_rerank.evaluation.selection import cross_validate, select

FAST = {"draws": 300, "repeats": 8}  # bootstrap resamples and CV shuffles: enough for the tests' margins


def synthetic(n: int, gains: list[float], seed: int, noise: float = 0.15) -> dict[str, dict[str, float]]:
    """The engine's nDCG@10 per query, and one configuration per true mean gain in `gains`, each with
    its own per-query noise (nDCG stays in [0, 1])."""
    rng = np.random.default_rng(seed)
    ids = [f"q{i}" for i in range(n)]
    engine = rng.uniform(0.1, 0.9, n)
    out = {ENGINE: dict(zip(ids, engine.tolist(), strict=True))}
    for j, gain in enumerate(gains):
        values = np.clip(engine + gain + rng.normal(0.0, noise, n), 0.0, 1.0)
        out[f"c{j}"] = dict(zip(ids, values.tolist(), strict=True))
    return out


def _decide(scores, **kw):
    return decide(scores, list(scores), ENGINE, seed=0, **{**FAST, **kw})


@pytest.mark.parametrize("method", ["choice", "queries"])
@pytest.mark.parametrize("n", [15, 30, 60, 300])
def test_a_loss_is_never_applied(n, method):
    """Every configuration truly loses 2-5 points; whatever the luck of the draw, the engine stays."""
    for seed in range(12):
        scores = synthetic(n, [-0.02, -0.03, -0.05, -0.02], seed)
        gate = _decide(scores, method=method)
        assert not gate.apply, gate.reason
        assert gate.reason.startswith("engine kept")


@pytest.mark.parametrize("n", [15, 30, 60, 300])
def test_no_gain_is_rarely_applied(n):
    """Eight configurations of pure noise around the engine: applied in at most 2 of 20 draws. (The
    per-query interval, blind to how unstable the choice is, applies such noise in 8-19 % of draws:
    the reason the default bootstraps the whole choice.)"""
    applied = sum(_decide(synthetic(n, [0.0] * 8, seed)).apply for seed in range(20))
    assert applied <= 2


def test_a_true_gain_is_applied_with_many_queries_and_priced_with_few():
    many = _decide(synthetic(300, [0.04, 0.0, 0.0, -0.02], seed=1))
    assert many.apply and many.best == "c0" and many.low > 0 and many.p_loss < 0.05
    assert many.low < many.expected < many.high and many.more_queries == 0
    assert "applied c0" in many.reason and "300 queries" in many.reason
    few = _decide(synthetic(15, [0.04, 0.0, 0.0, -0.02], seed=1))
    assert not few.apply and few.low < 0 < few.high
    if few.expected > 0:  # the words the issue asks for, and a number of queries that would settle it
        assert few.reason.startswith("engine kept: not enough evidence: 15 queries")
        assert "90 % interval" in few.reason and few.more_queries and few.more_queries > 0


def test_the_issues_long_shot_is_not_applied():
    """A configuration that wins big on two of 14 queries and loses a little on the rest: best on all 14,
    and today's rule (one held-out number) can take it; the interval does not."""
    ids = [f"q{i}" for i in range(14)]
    engine = dict.fromkeys(ids, 0.5)
    lucky = {q: (0.95 if q in ("q3", "q8") else 0.47) for q in ids}
    scores = {ENGINE: engine, "bmx+prf": lucky}
    assert np.mean(list(lucky.values())) > 0.5
    gate = _decide(scores)
    assert gate.best == "bmx+prf" and not gate.apply
    assert gate.hurt and all(change < 0 for _, change in gate.hurt)
    assert select(scores, list(scores), ENGINE).chosen == ENGINE


def test_a_few_changed_queries_are_not_evidence_enough():
    """BMX changes 4 of 15 queries, all for the better: no bootstrap resample goes below zero, but four
    coin flips the same way are p = 0.06; the sign test keeps the engine, and says so. With the same
    share of changes over 300 queries, it is applied."""
    ids = [f"q{i}" for i in range(15)]
    engine = {q: 0.3 + 0.02 * i for i, q in enumerate(ids)}
    bmx = {q: v + (0.3 if q in ("q1", "q5", "q9", "q13") else 0.0) for q, v in engine.items()}
    gate = _decide({ENGINE: engine, "bmx": bmx})
    assert (gate.wins, gate.losses) == (4, 0) and gate.sign_p == pytest.approx(1 / 16)
    assert gate.low > 0 and not gate.apply
    assert "changes 4 of 15 queries (4 better, 0 worse: a sign test gives p = 0.06" in gate.reason
    many = [f"q{i}" for i in range(300)]
    engine = {q: 0.3 + 0.001 * i for i, q in enumerate(many)}
    bmx = {q: v + (0.3 if i % 4 == 1 else 0.0) for i, (q, v) in enumerate(engine.items())}
    assert _decide({ENGINE: engine, "bmx": bmx}).apply


def test_ties_and_a_lone_engine_keep_the_engine():
    ids = [f"q{i}" for i in range(20)]
    same = dict.fromkeys(ids, 0.4)
    assert _decide({ENGINE: same, "bmx": dict(same)}).best == ENGINE
    alone = _decide({ENGINE: same})
    assert not alone.apply and alone.compared == 1


def test_more_queries_scales_with_the_width_of_the_interval():
    assert more_queries(20, 0.01, -0.01, 0.03) == 60  # half-width twice the gain: four times the queries
    assert more_queries(20, 0.02, 0.001, 0.04) == 0  # settled
    assert more_queries(20, -0.01, -0.03, 0.01) == 60  # a loss that cannot yet be told from nothing
    assert more_queries(20, 0.0, -0.01, 0.01) is None


def test_the_grid_shrinks_with_the_judged_queries():
    full = default_grid("text")
    assert [max_compared(n) for n in (5, 15, 30, 60, 1000)] == [1, 1, 3, 6, 100]
    assert [c.name for c in shrink(full, 15)] == [ENGINE, "bmx"]
    assert [c.name for c in shrink(full, 30)] == [ENGINE, "bm25", "bmx", "bmx+engine 0.5"]
    sixty = [c.name for c in shrink(full, 60)]
    assert "bmx+engine 0.7" in sixty and not any("prf" in n for n in sixty)  # PRF's tails: from 70 on
    assert "bmx+prf" in [c.name for c in shrink(full, 70)]
    assert shrink(full, 1000) == full
    fused = next(c for c in full if c.name == "bmx+engine 0.3")
    assert fused.bmx["combine"] == "linear" and fused.bmx["weight"] == 0.3


def test_several_fields_search_a_multi_match_and_weights_join_the_grid():
    from bmx_rerank.evaluation.run import search_body

    full = default_grid(["title", "text"])
    by_name = {c.name: c for c in full}
    assert by_name["bmx"].bmx["fields"] == ["title", "text"] and by_name["bmx"].bmx["field"] == "title"
    assert by_name["bmx title^2"].bmx["fields"] == ["title^2", "text"]
    assert by_name["bmx title^0.5"].bmx["fields"] == ["title^0.5", "text"]
    assert "bmx text^2" not in by_name and "bmx title^2" not in {c.name for c in default_grid("text")}
    # right after the named levers, before the alpha/beta grid
    kept = {c.name for c in shrink(full, 100)} - {ENGINE}
    assert kept == set(PRIORITY) | {"bmx title^0.5", "bmx title^2"}
    body = search_body(("title", "text"), "q", 100, None)
    assert body["query"] == {"multi_match": {"query": "q", "fields": ["title", "text"]}}
    from bmx_rerank.rerank.spec import parse_spec

    spec = parse_spec(by_name["bmx title^2"].bmx)  # what --apply stores is what a proxy can use
    assert spec.fields == (("title", 2.0), ("text", 1.0))


def test_the_report_says_the_interval_the_decision_and_the_queries_hurt(tmp_path):
    scores = synthetic(14, [0.01], seed=3)
    names = list(scores)
    ids = sorted(scores[ENGINE])
    sel = select(scores, names, ENGINE, k=5)
    means = {m: 0.5 for m in measure.MEASURES}
    rows = [
        Row(n, None if n == ENGINE else {"field": "f"}, {**means, "nDCG@10": measure.mean(scores[n], ids)},
            measure.compare(scores[n], scores[ENGINE], ids))
        for n in names
    ]  # fmt: skip
    texts = {q: f"text of {q}" for q in ids}
    report = Report("ix", "f", 14, 5, rows, sel, per_query=scores, texts=texts, grid_size=16)
    text = table(report)
    assert "expected gain on new queries of choosing the best this way" in text and "90 % interval" in text
    assert "2 of 16 configurations compared, fewer for 14 judged queries" in text
    assert "chance that applying loses" in text and "decision (*): engine kept" in text
    data = json.loads(json.dumps(report.to_json()))["selection"]
    assert data["gate"]["low"] < data["gate"]["high"] and data["decision"].startswith("engine kept")
    if data["gate"]["hurt"]:
        assert data["gate"]["hurt"][0]["text"].startswith("text of q") and "hurts most" in text
    assert plot(report, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_todays_rule_is_kept_for_the_comparison():
    scores = synthetic(30, [0.0] * 8, seed=5)
    old = cross_validate(scores, list(scores), ENGINE)
    new = select(scores, list(scores), ENGINE)
    assert new.cv_score == old.cv_score and new.fold_choices == old.fold_choices and old.gate is None
