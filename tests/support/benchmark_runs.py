"""A benchmark run as CI runs its small version: `python -m benchmarks.NAME ARGS` in a process of its
own, from the checkout's root, with this interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `benchmarks.NAME` with `args`; its exit status, stdout and stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
