"""`bmx-rerank eval` without a cluster: reading judgments, measuring, testing, choosing, showing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bmx_rerank.evaluation import measure
from bmx_rerank.evaluation.configs import ENGINE, grid
from bmx_rerank.evaluation.data import DataError, read_qrels, read_queries
from bmx_rerank.evaluation.report import Report, Row, plot, table
from bmx_rerank.evaluation.run import ranking, search_body
from bmx_rerank.evaluation.selection import cross_validate, folds


def test_beir_and_trec_files_are_read(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "a b"}\n{"_id": "2", "text": "c"}\n')
    (tmp_path / "q.tsv").write_text("id\ttext\n1\ta b\n2\tc\n")
    (tmp_path / "beir.tsv").write_text("query-id\tcorpus-id\tscore\n1\td1\t1\n1\td2\t2\n2\td3\t0\n")
    (tmp_path / "trec.txt").write_text("1 0 d1 1\n1 0 d2 2\n2 0 d3 0\n")
    assert read_queries(tmp_path / "q.jsonl") == read_queries(tmp_path / "q.tsv") == {"1": "a b", "2": "c"}
    want = {"1": {"d1": 1, "d2": 2}, "2": {"d3": 0}}
    assert read_qrels(tmp_path / "beir.tsv") == read_qrels(tmp_path / "trec.txt") == want
    (tmp_path / "bad.txt").write_text("1 0 d1 1\n1 d1\n")
    with pytest.raises(DataError, match="bad.txt:2"):
        read_qrels(tmp_path / "bad.txt")


def test_ids_with_spaces_a_byte_order_mark_and_queries_without_text(tmp_path):
    """BEIR's tsv is tab-separated: an id may hold spaces (CQADupStack, Quora-like data). A file saved
    with a byte-order mark reads the same; a query whose text is null or blank is not a query."""
    (tmp_path / "q.jsonl").write_text(
        '\ufeff{"_id": "a b", "text": "x"}\n{"_id": "n", "text": null}\n{"_id": "e", "text": "  "}\n', "utf-8"
    )
    assert read_queries(tmp_path / "q.jsonl") == {"a b": "x"}
    (tmp_path / "q.tsv").write_text("id\ttext\n1\tx\n2\t \n")
    assert read_queries(tmp_path / "q.tsv") == {"1": "x"}
    (tmp_path / "beir.tsv").write_text(
        "\ufeffquery-id\tcorpus-id\tscore\na b\tmy doc\t1\na b\tthree word id\t2\n", "utf-8"
    )
    assert read_qrels(tmp_path / "beir.tsv") == {"a b": {"my doc": 1, "three word id": 2}}


def test_measures_come_from_ir_measures_and_a_missing_query_counts_zero():
    qrels = {"1": {"a": 1, "b": 0}, "2": {"c": 2}}
    run = {"1": {"x": 2.0, "a": 1.0}}  # relevant at rank 2; query 2 returned nothing
    got = measure.per_query(qrels, run)
    assert got["RR@10"] == {"1": 0.5, "2": 0.0}
    assert got["nDCG@10"]["1"] == pytest.approx(1 / 1.584962500721156)
    assert got["R@100"] == {"1": 1.0, "2": 0.0}


def test_comparison_counts_wins_and_tests_the_pairs():
    ids = [str(i) for i in range(20)]
    engine = dict.fromkeys(ids, 0.5)
    better = {q: 0.5 + (0.2 if int(q) % 4 else -0.05) for q in ids}
    c = measure.compare(better, engine, ids)
    assert (c.wins, c.losses, c.ties) == (15, 5, 0) and c.p_value < 0.01
    same = measure.compare(engine, engine, ids)
    assert (same.ties, same.p_value) == (20, 1.0)


def test_cross_validation_reports_held_out_numbers():
    ids = [f"q{i}" for i in range(10)]
    scores = {
        ENGINE: dict.fromkeys(ids, 0.5),
        "good": dict.fromkeys(ids, 0.6),
        # wins big on one query only: chosen where that query is in training, punished where held out
        "lucky": {q: (5.0 if q == "q3" else 0.4) for q in ids},
    }
    sel = cross_validate(scores, [ENGINE, "good", "lucky"], ENGINE, k=5)
    assert sel.best == "lucky"  # best on all queries...
    assert sel.fold_choices.count("good") == 1  # ...but the fold holding q3 out chooses "good"
    assert sel.cv_score < (0.4 * 9 + 5.0) / 10  # the held-out number is below the in-sample one
    assert sel.engine_score == 0.5
    assert sel.cv_score == pytest.approx(0.44) and sel.chosen == ENGINE  # ...and below the engine held out
    assert sorted(q for f in folds(ids, 5) for q in f) == sorted(ids)


def test_a_gain_the_queries_cannot_tell_from_noise_keeps_the_engine():
    ids = [f"q{i}" for i in range(40)]
    rng = np.random.default_rng(3)
    engine = {q: float(v) for q, v in zip(ids, rng.uniform(0.2, 0.8, 40), strict=True)}
    noisy = {q: engine[q] + (0.3 if i % 2 else -0.28) for i, q in enumerate(ids)}  # +0.01 on average
    steady = {q: engine[q] + (0.05 if i % 4 else -0.01) for i, q in enumerate(ids)}  # small, but every time
    scores = {ENGINE: engine, "noisy": noisy, "steady": steady}
    assert cross_validate(scores, [ENGINE, "noisy"], ENGINE, k=4, significance=0.1).chosen == ENGINE
    sel = cross_validate(scores, [ENGINE, "noisy", "steady"], ENGINE, k=4, significance=0.1)
    assert sel.chosen == "steady" and set(sel.fold_choices) == {"steady"}
    assert sel.cv_score >= sel.engine_score
    assert cross_validate(scores, [ENGINE, "noisy"], ENGINE, k=4).best == "noisy"


def test_a_best_that_does_not_beat_the_engine_held_out_leaves_the_engine():
    ids = [f"q{i}" for i in range(10)]
    engine = dict.fromkeys(ids, 0.5)
    # Better on average, but only thanks to whichever queries a fold trains on: held out it loses.
    flaky = {q: (0.9 if i < 2 else 0.45) for i, q in enumerate(ids)}
    sel = cross_validate({ENGINE: engine, "flaky": flaky}, [ENGINE, "flaky"], ENGINE, k=10)
    assert sel.best == "flaky" and sel.cv_score <= sel.engine_score and sel.chosen == ENGINE


def test_ties_go_to_the_engine():
    ids = ["a", "b", "c", "d"]
    scores = {ENGINE: dict.fromkeys(ids, 0.5), "bmx": dict.fromkeys(ids, 0.5)}
    assert cross_validate(scores, [ENGINE, "bmx"], ENGINE, k=2).chosen == ENGINE


def test_the_grid_names_each_configuration_once():
    cands = grid("body", windows=(100, 200), alphas=(0.5, 1.0), betas=(0.1,), llm=True)
    names = [c.name for c in cands]
    assert names[0] == ENGINE and cands[0].bmx is None and len(set(names)) == len(names)
    assert {"bm25", "bmx", "bmx w200", "bmx alpha=0.5 beta=0.1", "bmx+prf", "bmx+llm"} <= set(names)
    assert next(c for c in cands if c.name == "bmx w200").bmx["window_size"] == 200


def test_search_bodies_and_served_order():
    assert search_body("f", "q", 100, None) == {"query": {"match": {"f": "q"}}, "_source": False, "size": 100}
    body = search_body("f", "q", 100, {"field": "f", "window_size": 50})
    assert body["size"] == 50 and body["ext"]["bmx"]["window_size"] == 50
    answer = {"hits": {"hits": [{"_id": "b"}, {"_id": "q1"}, {"_id": "a"}]}}
    assert ranking(answer, "q1", drop_self=True) == {"b": 2.0, "a": 1.0}


def test_report_table_json_and_plot(tmp_path):
    ids = ["1", "2"]
    per = {ENGINE: {"1": 0.5, "2": 0.5}, "bmx": {"1": 0.7, "2": 0.6}}
    sel = cross_validate(per, [ENGINE, "bmx"], ENGINE, 2, significance=1.0)
    means = {"nDCG@10": 0.5, "R@100": 0.8, "RR@10": 0.4}
    rows = [
        Row(ENGINE, None, means, measure.compare({"1": 0.5, "2": 0.5}, {"1": 0.5, "2": 0.5}, ids)),
        Row(
            "bmx",
            {"field": "f"},
            {**means, "nDCG@10": 0.65},
            measure.compare({"1": 0.7, "2": 0.6}, {"1": 0.5, "2": 0.5}, ids),
        ),
    ]
    report = Report("ix", "f", 2, 2, rows, sel, per_query=per)
    text = table(report)
    assert "bmx" in text and "+15.00" in text and "2/0/0" in text and "chosen (*): bmx" in text
    data = json.loads(json.dumps(report.to_json()))
    assert (
        data["selection"]["chosen_ext_bmx"] == {"field": "f"} and data["selection"]["cross_validated"] == 0.65
    )
    path = plot(report, tmp_path / "p.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cli_says_what_is_wrong_with_its_input(tmp_path):
    from click.testing import CliRunner

    from bmx_rerank.cli import main

    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "a"}\n')
    (tmp_path / "bad.tsv").write_text("1 0 d1 1\n1 d1\n")
    (tmp_path / "other.tsv").write_text("9 0 d1 1\n")
    args = [
        "eval",
        "ix",
        "--field",
        "f",
        "--queries",
        str(tmp_path / "q.jsonl"),
        "--upstream",
        "http://127.0.0.1:9",
    ]
    bad = CliRunner().invoke(main, [*args, "--qrels", str(tmp_path / "bad.tsv")])
    assert bad.exit_code == 2 and "bad.tsv:2" in bad.output
    none = CliRunner().invoke(main, [*args, "--qrels", str(tmp_path / "other.tsv")])
    assert none.exit_code == 1 and "no query has both a text and judgments" in none.output


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--folds", "1"], "--folds"),
        (["--apply"], "one index or alias name"),
        (["--plot", "/nonexistent-dir/x.png"], "cannot write into /nonexistent-dir"),
        (["--save", "/nonexistent-dir/x.json"], "cannot write into /nonexistent-dir"),
    ],
)
def test_eval_refuses_what_it_cannot_do_before_it_searches(tmp_path, extra, said):
    """No cluster answers here (port 1): each is refused up front, never after the whole evaluation."""
    from click.testing import CliRunner

    from bmx_rerank.cli import main

    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "a"}\n')
    (tmp_path / "r.tsv").write_text("query-id\tcorpus-id\tscore\n1\td\t1\n")
    args = ["eval", "logs-*", "--field", "body", "--queries", str(tmp_path / "q.jsonl")]
    args += ["--qrels", str(tmp_path / "r.tsv"), "--upstream", "http://127.0.0.1:1", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and said in result.output, result.output
