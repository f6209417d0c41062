"""20,000 idle client connections cannot stop a normal request being answered: the proxy (a separate
`bmx-rerank serve` process, its file-descriptor limit raised to the hard one) closes the oldest idle
connection to make room for each new one past its cap, and says so in its metrics."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

from tests.support.engine_client import EngineClient
from tests.support.proxy_process import serve

IDLE = 20_000
HOLDERS = 2  # processes holding the idle connections (each under this machine's fd limit)

HOLD = textwrap.dedent(
    """
    import resource, socket, sys, time
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    socks, failed = [], 0
    deadline = time.monotonic() + 150  # opening 10,000 connections takes ~30 s on a busy 2-core machine
    while len(socks) + failed < n and time.monotonic() < deadline:
        try:
            socks.append(socket.create_connection((host, port), timeout=5))
        except OSError:
            failed += 1
    print(len(socks), failed, flush=True)
    sys.stdin.read()  # held until the test closes stdin
    """
)


def fetch(url: str, data: bytes | None = None, timeout: float = 10) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, resp.read()


def test_twenty_thousand_idle_connections_cannot_stop_a_normal_request(engine: EngineClient, make_index):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 4096:
        pytest.skip(f"the hard file-descriptor limit ({hard}) is too low to hold many connections")
    index = make_index({"properties": {"body": {"type": "text"}}})
    engine.ok("PUT", f"/{index}/_doc/1", {"body": "red fox"}, {"refresh": "true"})
    started = time.monotonic()
    with serve(engine.url, ["--idle-timeout", "600", "--header-timeout", "600"]) as proxy:
        host, port = proxy.url.removeprefix("http://").split(":")
        holders = [
            subprocess.Popen(
                [sys.executable, "-c", HOLD, host, port, str(IDLE // HOLDERS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(HOLDERS)
        ]
        try:
            opened = [tuple(map(int, h.stdout.readline().split())) for h in holders]  # type: ignore[union-attr]
            assert sum(o[0] for o in opened) + sum(o[1] for o in opened) == IDLE, opened
            start = time.monotonic()
            status, body = fetch(
                f"{proxy.url}/{index}/_search", json.dumps({"query": {"match_all": {}}}).encode()
            )
            seconds = time.monotonic() - start
            assert status == 200 and json.loads(body)["hits"]["total"]["value"] == 1
            assert seconds < 5, f"answered after {seconds:.1f}s"
            _, text = fetch(f"{proxy.url}/_bmx/metrics")
            lines = {
                line.split(" ")[0]: float(line.split(" ")[1])
                for line in text.decode().splitlines()
                if line.startswith("bmx_client_connections")
            }
            closed = lines.get('bmx_client_connections_closed_total{reason="cap"}', 0.0)
            print(
                f"opened {opened}, oldest idle closed {closed:.0f}, open {lines['bmx_client_connections']:.0f}"
            )
            assert closed > 0, "past the cap, the oldest idle connections made room"
            assert lines["bmx_client_connections"] <= IDLE
            logged = [
                json.loads(line) for line in proxy.log.read_bytes().splitlines() if line.startswith(b"{")
            ]
            assert any(entry.get("reason") == "cap" for entry in logged), "the closes are logged"
        finally:
            for h in holders:
                h.stdin.close()  # type: ignore[union-attr]
                h.wait(30)
    assert time.monotonic() - started < 330
