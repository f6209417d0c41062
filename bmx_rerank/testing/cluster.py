"""A real cluster of several nodes of one distribution on this machine, for the tests and benchmarks
that need a node to die: `local_cluster(ClusterRequest(...))` starts them, waits until they have formed
one cluster, and stops them and removes their data on the way out, whatever happened.

The nodes find each other on transport ports picked up front (`discovery.seed_hosts`), never by
single-node discovery. The first `masters` nodes may be elected and bootstrap the cluster
(`cluster.initial_master_nodes`); the others are data-only, so that killing one of them never costs the
cluster its master. Each node is a process group of its own (`Member.kill` is `kill -9` of all of it).
A cluster's directory records its nodes and its owner, so that the next start removes what an owner
killed before it could clean up left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bmx_rerank.testing import host
from bmx_rerank.testing.artifacts import ensure_distribution
from bmx_rerank.testing.host import check_traversable, ensure_run_user, locked, makedirs_0755, state_dir
from bmx_rerank.testing.java import choose_java, java_candidates
from bmx_rerank.testing.kinds import EngineKind, Reporter, quiet
from bmx_rerank.testing.node import engine_env, member_settings, prepare_node
from bmx_rerank.testing.process import (
    Launched,
    cluster_health,
    free_ports,
    group_alive,
    kill_group,
    proc_start_ticks,
    spawn,
    wait_healthy,
)

CLUSTER_HEAP = "-Xms512m -Xmx512m"
START_TIMEOUT_S = 180.0
MEMBERS_FILE = "members.json"


@dataclass(frozen=True)
class ClusterRequest:
    """How many nodes of which distribution, how many of them master-eligible, and their heap."""

    kind: EngineKind
    version: str
    nodes: int = 2
    masters: int = 1
    heap: str = CLUSTER_HEAP
    java_home: Path | None = None
    timeout: float = START_TIMEOUT_S


@dataclass
class Member:
    """One node of the cluster: its HTTP URL, transport port, role, directory and process."""

    name: str
    url: str
    transport_port: int
    master_eligible: bool
    node_dir: Path
    console: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None and group_alive(self.proc.pid)

    def kill(self) -> None:
        """`kill -9` of the whole node (launcher and server JVM) at once: no shutdown, no goodbye to its
        peers, as when a machine dies."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        for _ in range(100):  # the server JVM may outlive its launcher's exit by a moment
            if not group_alive(self.proc.pid):
                return
            time.sleep(0.05)

    def stop(self) -> None:
        kill_group(self.proc.pid, timeout=15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


@dataclass
class LocalCluster:
    """The running cluster: its name and members; `stop` ends every node and removes its directory."""

    kind: EngineKind
    version: str
    name: str
    root: Path
    members: list[Member]

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def health(self, params: str = "") -> dict[str, object] | None:
        """/_cluster/health from the first live member (`params`: e.g. "?wait_for_nodes=1")."""
        for m in self.members:
            if m.alive():
                return cluster_health(m.url + params, timeout=30.0)
        return None

    def wait_for_nodes(self, nodes: int, timeout: float = 60.0) -> dict[str, object]:
        """Until the cluster counts exactly `nodes` nodes (e.g. after one was killed) and is yellow or
        green: its health then."""
        deadline = time.monotonic() + timeout
        while True:
            health = self.health()
            ready = health is not None and health.get("status") in ("yellow", "green")
            if ready and health is not None and health.get("number_of_nodes") == nodes:
                return health
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: not {nodes} node(s) within {timeout:.0f}s: {health}")
            time.sleep(0.2)

    def stop(self) -> None:
        for m in self.members:
            m.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def clusters_dir() -> Path:
    return state_dir() / "clusters"


def start_cluster(req: ClusterRequest, report: Reporter = quiet) -> LocalCluster:
    """Start `req.nodes` nodes as one cluster and return it once all have joined and it is yellow or
    green; on any failure every node started is stopped and the directory removed."""
    if not 1 <= req.masters <= req.nodes:
        raise ValueError("masters must be between 1 and the number of nodes")
    java = choose_java(req.kind, req.version, java_candidates(req.java_home))
    home = ensure_distribution(req.kind, req.version, report)
    run_as = ensure_run_user(report)
    if host.is_root():
        check_traversable(state_dir())
    name = f"bmx-rerank-{req.kind}-{uuid.uuid4().hex[:8]}"
    root = clusters_dir() / name
    cluster = LocalCluster(req.kind, req.version, name, root, [])
    with locked(clusters_dir() / ".lock"):  # no other start takes this one for abandoned
        remove_abandoned()
        makedirs_0755(root)
        _record(cluster)
    ports = free_ports(2 * req.nodes)
    http_ports, transport_ports = ports[: req.nodes], ports[req.nodes :]
    names = [f"{name}-{i}" for i in range(req.nodes)]
    seeds = [f"127.0.0.1:{p}" for p in transport_ports]
    masters = names[: req.masters]
    try:
        for node_name, http, transport in zip(names, http_ports, transport_ports, strict=True):
            node = root / node_name
            settings = member_settings(req.kind, name, node_name, http, transport, node, seeds, masters)
            logs = prepare_node(req.kind, home, run_as, node, settings)
            console = logs / "console.log"
            env = engine_env(req.kind, java, node, req.heap)
            proc = spawn([str(home / "bin" / req.kind)], node, env, console, run_as)
            url = f"http://127.0.0.1:{http}"
            cluster.members.append(
                Member(node_name, url, transport, node_name in masters, node, console, proc)
            )
            _record(cluster)
        report(f"starting {req.nodes} {req.kind} {req.version} nodes as {name} with Java {java.version}")
        launched = [Launched(m.name, m.proc, m.console) for m in cluster.members]
        for m in cluster.members:  # each answers as a member of one cluster of them all
            wait_healthy(m.url, launched, name, req.timeout, nodes=req.nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def local_cluster(req: ClusterRequest, report: Reporter = quiet) -> Iterator[LocalCluster]:
    """A started cluster, stopped and removed on the way out (an exception or an interrupt included)."""
    cluster = start_cluster(req, report)
    try:
        yield cluster
    finally:
        cluster.stop()


def _record(cluster: LocalCluster) -> None:
    """The cluster's owner (this process) and nodes, for `remove_abandoned`."""
    members = [{"pid": m.proc.pid, "ticks": proc_start_ticks(m.proc.pid)} for m in cluster.members]
    owner = {"pid": os.getpid(), "ticks": proc_start_ticks(os.getpid())}
    (cluster.root / MEMBERS_FILE).write_text(json.dumps({"owner": owner, "members": members}))


def remove_abandoned() -> None:
    """Stop the nodes and remove the directory of every cluster whose owner is gone (killed before it
    could stop them); called under the clusters' lock."""
    for root in clusters_dir().iterdir():
        if not root.is_dir():
            continue
        try:
            record = json.loads((root / MEMBERS_FILE).read_text())
        except (OSError, ValueError):
            record = {"owner": {"pid": 0, "ticks": None}, "members": []}
        owner = record["owner"]
        if owner["pid"] and proc_start_ticks(owner["pid"]) == owner["ticks"]:
            continue  # its owner still runs it
        for m in record["members"]:
            ticks = proc_start_ticks(m["pid"])
            if ticks == m["ticks"] or (ticks is None and group_alive(m["pid"])):  # or its server JVM
                kill_group(m["pid"], timeout=10)
        shutil.rmtree(root, ignore_errors=True)
