"""Shared test configuration: everything under tests/integration is marked `integration`."""

from __future__ import annotations

from pathlib import Path

import pytest

_INTEGRATION_DIR = Path(__file__).parent / "integration"


@pytest.fixture(autouse=True)
def _length_files(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's memory-mapped length tables (`stats.length_index`) in a directory of its own."""
    monkeypatch.setenv("BMX_RERANK_LENGTHS_DIR", str(tmp_path_factory.mktemp("lengths")))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark integration tests by location, so `-m "not integration"` needs no per-file bookkeeping."""
    for item in items:
        if _INTEGRATION_DIR in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.integration)


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under BMX_REQUIRE_ENGINES=1 (CI), any skipped test fails the run: nothing may be skipped there."""
    import os

    if os.environ.get("BMX_REQUIRE_ENGINES") == "1" and _skipped and exitstatus == 0:
        print(f"\nBMX_REQUIRE_ENGINES=1 but {len(_skipped)} test(s) skipped: {', '.join(_skipped[:5])}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_per_engine: dict[str, dict[str, int]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Count each engine-parametrized test's outcome under its engine (from the `engine_url` param)."""
    outcome = yield
    report = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    engine = callspec.params.get("engine_url") if callspec is not None else None
    if engine is None:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        result = "error" if report.when == "setup" and report.failed else report.outcome
        counts = _per_engine.setdefault(str(engine), {})
        counts[result] = counts.get(result, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Tests per engine in the log, so a run shows that every engine got the whole suite."""
    if not _per_engine:
        return
    terminalreporter.section("tests per engine")
    for engine, counts in sorted(_per_engine.items()):
        parts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        terminalreporter.write_line(f"{engine:16} {sum(counts.values()):5d} tests: {parts}")
