"""Shared test configuration: everything under tests/integration is marked `integration`."""

from __future__ import annotations

from pathlib import Path

import pytest

_INTEGRATION_DIR = Path(__file__).parent / "integration"


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
