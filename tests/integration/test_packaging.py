"""The package as users get it: `python -m build` makes a wheel and an sdist that `twine check` accepts,
and the wheel installs with the `elasticsearch` extra into a fresh venv whose `bmx-rerank --help` runs.

(Under tests/integration because, like the engines, it needs the outside world: PyPI for the build
backend and the dependencies.)"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str | Path, cwd: Path = ROOT) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheel_and_sdist_build_check_and_install(tmp_path: Path):
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    assert "PASSED" in _run(sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists)

    names = _run(sys.executable, "-m", "zipfile", "-l", wheels[0])
    assert "bmx_rerank/scoring.py" in names and "bmx_rerank/data/" in names
    assert "tests/" not in names  # the test tree is not shipped

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        f"{wheels[0]}[elasticsearch]",
    )
    assert "Usage: bmx-rerank" in _run(env_dir / "bin" / "bmx-rerank", "--help", cwd=tmp_path)
    # The extra brought the official client, and the wrapper imports with it.
    _run(python, "-c", "import elasticsearch, bmx_rerank.client", cwd=tmp_path)
