"""The images, run: docker/compose.yaml brought up with podman-compose (an engine built from the Maven
archive, the sidecar image, the one-shot statistics build), then a reranked search through the
sidecar's container. Images: `bash scripts/build_image.sh` (scripts/test.sh runs it first)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"
IMAGES = ("localhost/bmx-rerank:latest", "localhost/bmx-rerank-elasticsearch:8.19.21")
INDEX, FIELD = "bmx-demo-python-docs", "content"  # what the one-shot `demo` loads and builds


def _unavailable(reason: str) -> None:
    if os.environ.get("BMX_REQUIRE_ENGINES") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, dict(resp.headers), json.loads(resp.read())


@pytest.fixture(scope="module")
def stack() -> Iterator[str]:
    """The compose project up, the one-shot statistics build finished; yields the sidecar's URL."""
    compose = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not shutil.which("podman") or not Path(compose).exists():
        _unavailable(
            "podman and podman-compose are needed (apt-get install podman; pip install podman-compose)"
        )
    env = {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "docker/containers.conf")),
    }
    for image in IMAGES:
        if subprocess.run(["podman", "image", "exists", image], env=env).returncode != 0:
            _unavailable(f"image {image} is missing: bash scripts/build_image.sh")
    project = f"bmxtest{uuid.uuid4().hex[:8]}"
    proxy_port, engine_port = _free_port(), _free_port()
    env.update(BMX_PROXY_PORT=str(proxy_port), BMX_ENGINE_PORT=str(engine_port))
    base = [compose, "-p", project, "-f", str(COMPOSE)]
    subprocess.run([*base, "up", "-d"], env=env, check=True, capture_output=True)
    try:
        # The one-shot waits for the cluster, loads the corpus, builds and stores statistics, exits 0.
        waited = subprocess.run(
            ["podman", "wait", f"{project}_stats_1"], env=env, capture_output=True, text=True, timeout=600
        )
        logs = subprocess.run(
            ["podman", "logs", f"{project}_stats_1"], env=env, capture_output=True, text=True
        )
        assert waited.stdout.strip() == "0", logs.stdout[-2000:] + logs.stderr[-2000:]
        assert "statistics: exact" in logs.stdout
        url = f"http://127.0.0.1:{proxy_port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                _call(f"{url}/_bmx/health", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield url
    finally:
        subprocess.run([*base, "down", "-t", "5"], env=env, capture_output=True)


def test_reranked_search_through_the_container(stack: str):
    body = {"query": {"match": {FIELD: "parse json"}}, "size": 3, "ext": {"bmx": {"field": FIELD}}}
    status, headers, answer = _call(f"{stack}/{INDEX}/_search", body)
    assert status == 200 and headers["X-BMX-Rerank"] == "bmx"
    marker = answer["_bmx"]
    assert marker["reranked"] is True and marker["estimated"] is False and marker["stale"] is False, marker
    hits = answer["hits"]["hits"]
    assert hits[0]["_id"].startswith("json.") and hits[0]["_score"] >= hits[-1]["_score"]
    # Not reranked: passed through as the cluster answers it.
    status, headers, plain = _call(f"{stack}/{INDEX}/_count")
    assert status == 200 and plain["count"] == 1865 and "X-BMX-Rerank" not in headers
    _, _, health = _call(f"{stack}/_bmx/health")
    assert health["upstream"] == ["http://elasticsearch:9200"]  # from BMX_RERANK_UPSTREAM
