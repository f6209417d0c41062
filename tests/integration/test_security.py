"""The proxy in front of Elasticsearch with security ON (x-pack, users and roles created over REST).

A separate single-node Elasticsearch 8.19 with `xpack.security.enabled=true` (HTTP without TLS on
loopback; the `elastic` password set as `bootstrap.password` in its keystore) is started for this module
by the engine launcher, unless `BMX_TEST_SECURE_ELASTICSEARCH_URL`, `BMX_TEST_SECURE_ELASTIC_PASSWORD`
and `BMX_TEST_SECURE_CONFIG_DIR` name one already running. Users and roles are those of the file realm
(config/users with {SHA} hashes, users_roles, roles.yml, reloaded by the node within a second or two;
written again and the node's role and realm caches cleared if it has not after 10 s): the integ-test
zip lacks the analysis-common module that the native realm's `.security` index needs, so
`PUT /_security/user` answers 400 "Unknown filter type [pattern_capture]". Between the proxy and the
engine a recorder (tests/integration/faultproxy.py, no faults) notes every call with its Authorization
header.

- a user without read on an index gets 403 through the proxy for a plain search, a reranked search and
  an msearch item, and every call the sidecar made on its behalf carried its own credentials and was
  refused;
- two users with rights on different indices searching one pattern that covers both get statistics over
  their own indices only (scores equal to those of a search on their own index), whoever came first,
  with exact and with estimated statistics;
- no credential appears in the proxy's logs (every record at DEBUG, all attributes) or metrics.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bmx_rerank.proxy import ProxyConfig, make_app, start_server
from bmx_rerank.stats import build as stats_build
from bmx_rerank.stats.cache import StatsCache
from bmx_rerank.testing import engine as eng
from bmx_rerank.upstream import Cluster
from tests.support.engine_client import unavailable
from tests.support.faults import FaultInjector
from tests.support.proxy_thread import LoopThread
from tests.support.serving import serve_app

USERS = {"alice": "role_a", "bob": "role_b"}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class Secured:
    url: str
    password: str  # the elastic superuser's
    config: Path  # the node's config directory: file realm users and roles
    users: dict[str, tuple[str, str]] = field(default_factory=dict)  # user -> (password, role)
    roles: dict[str, list[str]] = field(default_factory=dict)  # role -> index names (read)

    def publish(self) -> None:
        """Write the file realm (every user and role so far) and wait until the node has them."""
        users = "".join(
            f"{u}:{{SHA}}{base64.b64encode(hashlib.sha1(p.encode()).digest()).decode()}\n"
            for u, (p, _) in self.users.items()
        )
        users_roles = "".join(f"{r}:{u}\n" for u, (_, r) in self.users.items())
        roles = "".join(
            f"{r}:\n  indices:\n    - names: {json.dumps(names)}\n"
            # what a searcher needs to rerank: read (search, term vectors, the statistics store),
            # view_index_metadata (the field's search analyzer) and _analyze, which ES grants only with
            # `manage` or by its action name
            f"      privileges: [read, view_index_metadata, 'indices:admin/analyze']\n"
            for r, names in self.roles.items()
        )
        files = {"roles.yml": roles, "users_roles": users_roles, "users": users}
        self._write(files)
        start = time.monotonic()
        rewritten = start
        for user, (password, role) in self.users.items():
            want = {"index": [{"names": self.roles[role], "privileges": ["read"]}]}
            while True:
                status, answer = self.call(
                    "POST", "/_security/user/_has_privileges", want, basic(user, password)
                )
                if status == 200 and answer["has_all_requested"]:
                    break
                now = time.monotonic()
                assert now < start + 60, f"the node did not pick up {user}: {status} {answer}"
                if now > rewritten + 10:
                    # twice on a loaded CI machine a user was known and its role not, for a minute: the
                    # node's file watcher (every 5 s) had missed a change, or a lookup racing the reload
                    # had cached the role as missing (a rewrite of the same roles invalidates nothing).
                    # Write the files again, with a new modification time, and clear both caches.
                    self._write(files)
                    self.ok("POST", "/_security/role/*/_clear_cache")
                    self.ok("POST", "/_security/realm/*/_clear_cache")
                    rewritten = now
                time.sleep(0.3)

    def _write(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            tmp = self.config / f".{name}.tmp"
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(self.config / name)

    def call(self, method: str, path: str, body: Any = None, auth: str | None = None) -> tuple[int, Any]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        ctype = "application/x-ndjson" if isinstance(body, bytes) else "application/json"
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": ctype}
        )
        req.add_header("Authorization", auth or basic("elastic", self.password))
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        return status, json.loads(raw) if raw else None

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.call(method, path, body)
        assert 200 <= status < 300, (method, path, status, answer)
        return answer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    """A running Elasticsearch with security on: the given one, or one started here and stopped after."""
    url = os.environ.get("BMX_TEST_SECURE_ELASTICSEARCH_URL", "").rstrip("/")
    if url:
        config = Path(os.environ["BMX_TEST_SECURE_CONFIG_DIR"])
        yield Secured(url, os.environ["BMX_TEST_SECURE_ELASTIC_PASSWORD"], config)
        return
    state = tempfile.mkdtemp(prefix="bmx-secured-es-")
    os.chmod(state, 0o755)  # the engine's run user must traverse it
    password = secrets.token_urlsafe(18)
    port = int(os.environ.get("BMX_TEST_SECURE_PORT") or _free_port())
    old = os.environ.get("BMX_RERANK_STATE")
    os.environ["BMX_RERANK_STATE"] = state  # its own state: never the shared engines'
    try:
        req = eng.StartRequest(
            "elasticsearch", eng.DEFAULT_VERSIONS["elasticsearch"], port, password=password
        )
        try:
            started = eng.start(req)
        except (eng.EngineError, OSError) as exc:
            unavailable(f"could not start Elasticsearch with security on: {exc}")
        yield Secured(started.url, password, Path(started.node_dir) / "config")
    finally:
        eng.stop("elasticsearch")
        shutil.rmtree(state, ignore_errors=True)
        if old is None:
            os.environ.pop("BMX_RERANK_STATE", None)
        else:
            os.environ["BMX_RERANK_STATE"] = old


@dataclass
class World:
    es: Secured
    tag: str
    a: str  # alice may read it
    b: str  # bob may read it
    store: str
    passwords: dict[str, str]
    recorder: FaultInjector
    loop: LoopThread
    proxy: str

    def auth(self, user: str) -> str:
        return basic(user, self.passwords[user])

    def via(self, user: str, method: str, path: str, body: Any = None) -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        ctype = "application/x-ndjson" if isinstance(body, bytes) else "application/json"
        req = urllib.request.Request(
            self.proxy + path, data=data, method=method, headers={"Content-Type": ctype}
        )
        req.add_header("Authorization", self.auth(user))
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw, headers = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            status, raw, headers = err.code, err.read(), dict(err.headers)
        return status, json.loads(raw) if raw else None, headers


def _docs(prefix: str, n: int, common: str, rare: str) -> bytes:
    lines = []
    for i in range(n):
        words = [common] * (1 + i % 3) + ([rare] if i % 10 == 0 else []) + [f"w{i % 7}", "filler"]
        lines += [json.dumps({"index": {"_id": f"{prefix}{i}"}}), json.dumps({"body": " ".join(words)})]
    return ("\n".join(lines) + "\n").encode()


def _make_world(es: Secured, exact: bool, log_records: list[logging.LogRecord] | None = None) -> World:
    tag = uuid.uuid4().hex[:8]
    a, b, store = f"bmxsec-{tag}-a", f"bmxsec-{tag}-b", f"bmxsec-stats-{tag}"
    mappings = {"properties": {"body": {"type": "text"}}}
    for name, body in ((a, _docs("a", 40, "apple", "pear")), (b, _docs("b", 25, "pear", "apple"))):
        es.ok(
            "PUT",
            f"/{name}",
            {"settings": {"number_of_shards": 1, "number_of_replicas": 0}, "mappings": mappings},
        )
        assert not es.ok("POST", f"/{name}/_bulk?refresh=true", body)["errors"]
    if exact:
        auth = {"Authorization": basic("elastic", es.password)}

        async def build() -> None:
            async with aiohttp.ClientSession() as session:
                for name in (a, b):
                    await stats_build.build_snapshots(
                        Cluster(session, es.url), name, "body", auth, store=store
                    )

        import asyncio

        asyncio.run(build())
    passwords = {}
    for user, role in USERS.items():
        own = a if user == "alice" else b
        es.roles[f"{role}-{tag}"] = [own, store]
        passwords[f"{user}-{tag}"] = secrets.token_urlsafe(12)
        es.users[f"{user}-{tag}"] = (passwords[f"{user}-{tag}"], f"{role}-{tag}")
    es.publish()
    loop = LoopThread()
    recorder = FaultInjector(es.url)
    _, rurl = loop.run(serve_app(recorder.app()))
    app = make_app(
        ProxyConfig(upstream=rurl, timeout=10.0),
        lambda session, base: StatsCache(session, base, check_interval=300.0, store=store),
    )
    _, purl = loop.run(start_server(app))
    return World(es, tag, a, b, store, passwords, recorder, loop, purl)


def _drop_world(w: World) -> None:
    w.loop.close()
    for name in (w.a, w.b, w.store):
        w.es.call("DELETE", f"/{name}")
    for user, role in USERS.items():
        w.es.users.pop(f"{user}-{w.tag}", None)
        w.es.roles.pop(f"{role}-{w.tag}", None)


@pytest.fixture(scope="module", params=[True, False], ids=["exact", "estimated"])
def world(secured: Secured, request: pytest.FixtureRequest) -> Iterator[World]:
    w = _make_world(secured, exact=request.param)
    yield w
    _drop_world(w)


def reranked(text: str = "apple pear") -> dict[str, Any]:
    return {
        "size": 50,
        "query": {"match": {"body": text}},
        "ext": {"bmx": {"field": "body", "window_size": 100, "mode": "bm25", "explain": True}},
    }


def scores(answer: dict[str, Any]) -> dict[str, float]:
    return {h["_id"]: h["_score"] for h in answer["hits"]["hits"]}


def test_a_user_without_read_gets_403_for_everything(world: World):
    bob = f"bob-{world.tag}"
    mark = len(world.recorder.seen)
    status, answer, _ = world.via(bob, "POST", f"/{world.a}/_search", {"query": {"match": {"body": "apple"}}})
    assert status == 403 and answer["error"]["type"] == "security_exception", answer
    status, answer, headers = world.via(bob, "POST", f"/{world.a}/_search", reranked())
    assert status == 403 and answer["error"]["type"] == "security_exception", answer
    assert answer["status"] == 403
    ndjson = (json.dumps({"index": world.a}) + "\n" + json.dumps(reranked()) + "\n").encode()
    status, answer, _ = world.via(bob, "POST", "/_msearch", ndjson)
    assert status == 200 and answer["responses"][0]["status"] == 403, answer
    calls = world.recorder.seen[mark:]
    assert calls, "nothing reached the engine"
    assert {auth for _, _, auth, _ in calls} == {world.auth(bob)}, "a call went up without bob's credentials"
    on_a = [(m, p, s) for m, p, _, s in calls if world.a in p]
    assert on_a and all(s == 403 for _, _, s in on_a), on_a
    sidecar = [p for _, p, _ in on_a if not p.endswith(("_search", "_msearch"))]
    assert sidecar, f"no sidecar call was tried on bob's behalf: {on_a}"


def test_each_user_gets_statistics_over_its_own_indices_only(world: World):
    """One pattern covering both indices: each user's reranked scores equal those of a search on their
    own index alone (statistics of that index only), in either order of who fills the caches first."""
    alice, bob = f"alice-{world.tag}", f"bob-{world.tag}"
    pattern = f"bmxsec-{world.tag}-*"

    def search(user: str, target: str) -> dict[str, float]:
        status, answer, headers = world.via(user, "POST", f"/{target}/_search", reranked())
        assert status == 200 and headers["X-BMX-Rerank"] == "bm25", (status, answer)
        return scores(answer)

    alice_pattern_first = search(alice, pattern)
    bob_pattern = search(bob, pattern)
    alice_pattern_again = search(alice, pattern)
    assert set(alice_pattern_first) and all(i.startswith("a") for i in alice_pattern_first)
    assert set(bob_pattern) and all(i.startswith("b") for i in bob_pattern)
    assert alice_pattern_first == alice_pattern_again == pytest.approx(search(alice, world.a))
    assert bob_pattern == pytest.approx(search(bob, world.b))
    # The check can fail: the superuser's statistics over the pattern (both indices) give other scores.
    req = urllib.request.Request(
        world.proxy + f"/{pattern}/_search",
        data=json.dumps(reranked()).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": basic("elastic", world.es.password)},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        both = scores(json.loads(resp.read()))
    common = set(both) & set(alice_pattern_first)
    assert common and any(both[i] != pytest.approx(alice_pattern_first[i]) for i in common)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = logging.Formatter().format(record)  # message and stack trace
        self.texts.append(text + " " + repr(record.__dict__))


def test_no_credential_in_logs_or_metrics(secured: Secured):
    capture = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        w = _make_world(secured, exact=True)
        try:
            alice, bob = f"alice-{w.tag}", f"bob-{w.tag}"
            w.via(alice, "POST", f"/{w.a}/_search", reranked())
            w.via(bob, "POST", f"/{w.a}/_search", reranked())  # 403
            w.via(bob, "POST", f"/{w.b}/_search", {"query": {"match": {"body": "pear"}}})
            w.via(alice, "POST", f"/{w.a}/_search", {"ext": {"bmx": {"field": "body", "alpha": "x"}}})  # 400
            w.via(
                alice, "POST", f"/{w.a}/_search", {**reranked(), "ext": {"bmx": {"field": "nope"}}}
            )  # fallback
            w.via(alice, "PUT", f"/{w.a}/_doc/new", {"body": "apple"})  # 403: read only
            with urllib.request.urlopen(w.proxy + "/_bmx/metrics", timeout=10) as resp:
                metrics_text = resp.read().decode()
            with urllib.request.urlopen(w.proxy + "/_bmx/health", timeout=10) as resp:
                health_text = resp.read().decode()
            secrets_ = [secured.password, *w.passwords.values(), *(w.auth(u).split()[1] for u in w.passwords)]
            secrets_.append(basic("elastic", secured.password).split()[1])
        finally:
            _drop_world(w)
    finally:
        root.removeHandler(capture)
        root.setLevel(old_level)
    assert capture.texts, "nothing was logged: the check would be empty"
    assert "bmx_requests" in metrics_text
    for secret in secrets_:
        assert secret not in metrics_text and secret not in health_text
        leaked = [t for t in capture.texts if secret in t]
        assert not leaked, leaked[:2]
    assert not [t for t in capture.texts if "Basic " in t or "Authorization" in t]
