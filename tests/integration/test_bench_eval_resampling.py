"""A small run of benchmarks/eval_resampling.py (the full protocol and its figures are in
benchmarks/RESULTS.md): on a SciFact slice in a real engine, every configuration is run once through the
proxy, draws of tuning queries are decided by today's rule and the new one, and the applied configuration,
written with `write_config` and searched through a proxy that reads it, scores on the held-out queries
exactly what the cached per-query scores say."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.data import SCIFACT

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.parametrize("layout", ["one field", "fields"])
def test_small_resampling_run_reports_both_rules_and_checks_the_proxy(
    elasticsearch_url: str, layout: str
) -> None:
    """With `fields`, title and text apart: multi_match searches, field weights in the grid, and the
    applied configuration's `fields` served by the proxy's policy."""
    if not (SCIFACT / "corpus.jsonl").is_file():
        pytest.skip("no shared SciFact")
    prefix = f"evalgate-ci-{uuid.uuid4().hex[:8]}-"
    args = ["--engine", f"es={elasticsearch_url}", "--dataset", "scifact", "--analyzer", "standard"]
    args += ["--fields"] if layout == "fields" else []
    args += ["--queries", "45", "--other-docs", "300", "--sizes", "15,30", "--draws", "4"]
    args += ["--index-prefix", prefix, "--cleanup"]
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.eval_resampling", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    rows = re.findall(
        r"^\| (\d+) \| (\d+) \| (today|new|new-q) \| (\d+) \(.*?\) \| ([-+][\d.]+) \| ([-+][\d.]+) \| (\d+) ",
        out,
        re.M,
    )
    assert {(r[0], r[2]) for r in rows} == {
        (size, rule) for size in ("15", "30") for rule in ("today", "new", "new-q")
    }, out
    for _size, draws, _rule, lost, worst, mean, kept in rows:
        assert int(draws) == 4 and 0 <= int(lost) <= 4 and 0 <= int(kept) <= 4
        assert float(worst) <= float(mean)
    assert "one draw through the proxy would take" in out
    assert f"x {18 if layout == 'fields' else 16} configurations" in out
    # The through-the-proxy check: printed when a rule applied something, and equal (else exit 1).
    for got, cached in re.findall(
        r"through the proxy ([\d.]+), from the cached per-query scores ([\d.]+)", out
    ):
        assert abs(float(got) - float(cached)) < 0.1
