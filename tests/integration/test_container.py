"""The images, run: docker/compose.yaml with docker/compose.tls.yaml brought up with podman-compose (an
Elasticsearch built from the Maven archive, with x-pack security and HTTPS from a throwaway CA; the
sidecar image verifying it against that CA and serving HTTPS itself; the one-shot statistics build),
then a reranked search over HTTPS through the sidecar's container, with the caller's credentials.
Images: `bash scripts/build_image.sh` (scripts/test.sh runs it first)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.support.engine_client import unavailable

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = (ROOT / "docker" / "compose.yaml", ROOT / "docker" / "compose.tls.yaml")
PASSWORD = f"pw-{uuid.uuid4().hex[:12]}"
AUTH = {"Authorization": "Basic " + base64.b64encode(f"elastic:{PASSWORD}".encode()).decode()}
IMAGES = ("localhost/bmx-rerank:latest", "localhost/bmx-rerank-elasticsearch:8.19.21")
INDEX, FIELD = "bmx-demo-python-docs", "content"  # what the one-shot `demo` loads and builds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(
    url: str, body: dict | None = None, timeout: float = 30, ca: str | None = None, auth: bool = True
) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(AUTH if auth else {})}
    req = urllib.request.Request(url, data=data, headers=headers)
    context = ssl.create_default_context(cafile=ca) if ca else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def _certificates(into: Path) -> None:
    """ca.pem; node.pem/node-key.pem for Elasticsearch (named `elasticsearch` in the compose network);
    proxy.pem for the sidecar. Readable by the containers' unprivileged users."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(into / "ca.pem"))
    node = ca.issue_cert("elasticsearch", "localhost", "127.0.0.1")
    (into / "node.pem").write_bytes(b"".join(blob.bytes() for blob in node.cert_chain_pems))
    node.private_key_pem.write_to_path(str(into / "node-key.pem"))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(into / "proxy.pem")
    )
    into.chmod(0o755)
    for path in into.iterdir():
        path.chmod(0o644)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The compose project up, the one-shot statistics build finished; yields the sidecar's HTTPS URL
    and the CA bundle that vouches for it."""
    compose = shutil.which("podman-compose") or str(Path(sys.executable).with_name("podman-compose"))
    if not shutil.which("podman") or not Path(compose).exists():
        unavailable(
            "podman and podman-compose are needed (apt-get install podman; pip install podman-compose)"
        )
    env = {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(ROOT / "docker/containers.conf")),
    }
    for image in IMAGES:
        if subprocess.run(["podman", "image", "exists", image], env=env).returncode != 0:
            unavailable(f"image {image} is missing: bash scripts/build_image.sh")
    project = f"bmxtest{uuid.uuid4().hex[:8]}"
    proxy_port, engine_port = _free_port(), _free_port()
    certs = tmp_path_factory.mktemp("certs")
    _certificates(certs)
    env.update(
        BMX_PROXY_PORT=str(proxy_port),
        BMX_ENGINE_PORT=str(engine_port),
        BMX_CERTS=str(certs),
        ELASTIC_PASSWORD=PASSWORD,
    )
    base = [compose, "-p", project, "-f", str(COMPOSE[0]), "-f", str(COMPOSE[1])]
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
        url, ca = f"https://127.0.0.1:{proxy_port}", str(certs / "ca.pem")
        deadline = time.monotonic() + 60
        while True:
            try:
                _call(f"{url}/_bmx/health", timeout=5, ca=ca)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        yield url, ca
    finally:
        subprocess.run([*base, "down", "-t", "5"], env=env, capture_output=True)


def test_reranked_search_through_the_container_over_tls(stack: tuple[str, str]):
    url, ca = stack
    body = {"query": {"match": {FIELD: "parse json"}}, "size": 3, "ext": {"bmx": {"field": FIELD}}}
    status, headers, answer = _call(f"{url}/{INDEX}/_search", body, ca=ca)
    assert status == 200 and headers["X-BMX-Rerank"] == "bmx"
    marker = answer["_bmx"]
    assert marker["reranked"] is True and marker["estimated"] is False and marker["stale"] is False, marker
    hits = answer["hits"]["hits"]
    assert hits[0]["_id"].startswith("json.") and hits[0]["_score"] >= hits[-1]["_score"]
    # Not reranked: passed through as the cluster answers it.
    status, headers, plain = _call(f"{url}/{INDEX}/_count", ca=ca)
    assert status == 200 and plain["count"] == 1865 and "X-BMX-Rerank" not in headers
    # The sidecar holds no credentials of its own: without the caller's, the cluster says no.
    status, _, refused = _call(f"{url}/{INDEX}/_search", body, ca=ca, auth=False)
    assert status == 401, refused
    _, _, health = _call(f"{url}/_bmx/health", ca=ca)
    assert health["upstream"] == ["https://elasticsearch:9200"]  # from BMX_RERANK_UPSTREAM
    with pytest.raises(urllib.error.URLError):  # HTTPS, and a certificate only the test's CA vouches for
        _call(f"{url}/_bmx/health")
