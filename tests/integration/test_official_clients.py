"""Both majors of each official client, unchanged, through the proxy: elasticsearch-py 8 and 9,
opensearch-py 2 and 3 — search, reranked search (ext.bmx), bulk, scroll, point in time, errors.

Two majors of one package cannot share a venv: the venv holds one (elasticsearch 8, opensearch-py 3),
the other is installed once with `pip install --target` into a cached side directory
(`$BMX_TEST_CLIENTS_DIR`, default ~/.cache/bmx-rerank/clients) and `official_client_script.py` runs in a
subprocess with that directory first on PYTHONPATH. Which majors meet which server: elasticsearch-py 9
sends `compatible-with=9`, which Elasticsearch 8 refuses, so it runs against 9.x only (and 8 against
both); opensearch-py 2 and 3 against every OpenSearch."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bmx_rerank.stats.cache import StatsCache
from tests.support.engine_client import EngineClient
from tests.support.proxy_thread import ProxyThread

SCRIPT = Path(__file__).with_name("official_client_script.py")
# (package, requirement) of each side install; the venv's own majors need none.
SIDE = {
    ("elasticsearch", 9): "elasticsearch>=9,<10",
    ("opensearch", 2): "opensearch-py>=2.4,<3",
}
VENV = {"elasticsearch": 8, "opensearch": 3}


def clients_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bmx-rerank" / "clients"
    return Path(os.environ.get("BMX_TEST_CLIENTS_DIR") or default)


def side_install(kind: str, major: int) -> Path:
    """The side directory holding `kind`'s client `major` (installed on first use, under a lock)."""
    requirement = SIDE[(kind, major)]
    target = clients_dir() / f"{kind}-{major}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{kind}-{major}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".installed").exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 "--upgrade", "--target", str(target), requirement],
                check=True,
            )  # fmt: skip
            (target / ".installed").write_text(requirement + "\n")
    return target


def majors_for(engine: EngineClient) -> list[int]:
    if engine.kind == "elasticsearch":
        return [8, 9] if engine.major >= 9 else [8]
    return [2, 3]


def run_client(kind: str, major: int, url: str) -> dict:
    env = dict(os.environ)
    if major != VENV[kind]:
        env["PYTHONPATH"] = os.pathsep.join([str(side_install(kind, major)), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), kind, url], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{kind} client {major}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def proxy(engine: EngineClient):
    proxy = ProxyThread(engine.url, lambda session, base: StatsCache(session, base))
    yield proxy
    proxy.close()


def _refused_by_an_8_server(url: str) -> str:
    """What elasticsearch-py 9 gets from Elasticsearch 8 through the proxy: the server's own refusal."""
    env = {**os.environ, "PYTHONPATH": str(side_install("elasticsearch", 9))}
    code = (
        "import sys, elasticsearch\n"
        "es = elasticsearch.Elasticsearch(sys.argv[1])\n"
        "try:\n    es.search(index='_all', size=0)\n    print('accepted')\n"
        "except elasticsearch.ApiError as e:\n    print(e.meta.status, e.message)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True, text=True)
    return done.stdout + done.stderr


def test_both_majors_of_the_official_client_work_through_the_proxy(engine: EngineClient, proxy: ProxyThread):
    ran = {major: run_client(engine.kind, major, proxy.url)["version"] for major in majors_for(engine)}
    # Each run used the major it was meant to: the side install really shadowed the venv's.
    assert {major: int(version.split(".")[0]) for major, version in ran.items()} == {m: m for m in ran}
    if engine.kind == "elasticsearch" and engine.major < 9:
        # The mismatch as a user sees it: the cluster's refusal of compatible-with=9, passed through.
        assert _refused_by_an_8_server(proxy.url).startswith("400 media_type_header_exception")
