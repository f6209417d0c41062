"""The engine's process: starting it as the run user, its recorded state, whether it lives, stopping its
process group, ports, waiting for its cluster's health, its log."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bmx_rerank.testing import host
from bmx_rerank.testing.host import RunAs, makedirs_0755, state_dir
from bmx_rerank.testing.kinds import EngineError

STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 40


@dataclass
class EngineState:
    """What `start` records so that `stop`/`status` can find the engine from another process."""

    kind: str
    version: str
    url: str
    port: int
    pid: int
    start_ticks: int
    node_dir: str
    console_log: str
    java_home: str
    home: str
    user: str | None = None
    started_at: float = field(default_factory=time.time)
    startup_seconds: float = 0.0


def state_file(kind: str) -> Path:
    return state_dir() / kind / "state.json"


def load_state(kind: str) -> EngineState | None:
    """The recorded engine of this kind, if any (it may have died since)."""
    try:
        data = json.loads(state_file(kind).read_text())
        return EngineState(**data)
    except (OSError, ValueError, TypeError):
        return None


def save_state(state: EngineState) -> None:
    path = state_file(state.kind)
    makedirs_0755(path.parent)
    tmp = path.with_name(f"state.json.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def proc_start_ticks(pid: int) -> int | None:
    """Process start time from /proc, to tell our engine from a later process reusing its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(state: EngineState) -> bool:
    """Whether the recorded engine process (leader of its own process group) still runs."""
    _reap(state.pid)
    return proc_start_ticks(state.pid) == state.start_ticks


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie leader keeps the group "alive" for kill(); look for live members in /proc.
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def kill_group(pgid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM the engine's process group (CLI JVM + server JVM), SIGKILL what is left after `timeout`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pgid)
        if not group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        _reap(pgid)
        if not group_alive(pgid):
            return
        time.sleep(0.1)


def spawn(
    command: Sequence[str], cwd: Path, env: Mapping[str, str], console: Path, run_as: RunAs
) -> subprocess.Popen[bytes]:
    """Start an engine's launcher as the run user, leader of a process group of its own (so that its
    JVMs stop together and a terminal's Ctrl-C does not reach them), output appended to `console`."""
    with open(console, "ab") as out:
        if host.is_root():
            os.chown(console, run_as.uid, run_as.gid)
        return subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=run_as.uid if run_as.user else None,
            group=run_as.gid if run_as.user else None,
            extra_groups=[] if run_as.user else None,
        )


@dataclass(frozen=True)
class Launched:
    """A process being started, as `wait_healthy` watches it: what to call it, and its console log."""

    name: str
    proc: subprocess.Popen[bytes]
    console: Path


def wait_healthy(
    url: str,
    launched: Sequence[Launched],
    cluster: str,
    timeout: float,
    nodes: int = 1,
    password: str | None = None,
) -> None:
    """Poll `url`'s /_cluster/health until `nodes` nodes have joined and it is yellow or green; fail
    fast when a launched process exits, or when another cluster answers on the port."""
    deadline = time.monotonic() + timeout
    while True:
        for one in launched:
            code = one.proc.poll()
            if code is not None:
                raise EngineError(
                    f"{one.name} exited with code {code} during start. Last lines of {one.console}:\n"
                    f"{tail(one.console)}"
                )
        health = cluster_health(url, password=password)
        if health and health.get("status") in ("yellow", "green"):
            if health.get("cluster_name") != cluster:
                port = url.rsplit(":", 1)[-1]
                raise EngineError(
                    f"{url} answers as cluster {health.get('cluster_name')!r}, not ours: another "
                    f"engine grabbed port {port}; choose another (--port)"
                )
            if int(str(health.get("number_of_nodes", 0))) >= nodes:
                return
        if time.monotonic() > deadline:
            names = ", ".join(one.name for one in launched)
            raise EngineError(
                f"{names} did not become ready within {timeout:.0f}s (try --timeout). Last lines of "
                f"{launched[0].console}:\n{tail(launched[0].console)}"
            )
        time.sleep(0.5)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on host:port (the engines also set SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct loopback ports nothing listens on right now (the OS picks them, all held open until
    the last is picked; one may be taken again before use)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def cluster_health(url: str, timeout: float = 2.0, password: str | None = None) -> dict[str, object] | None:
    """GET /_cluster/health (the ES integ zip has no `GET /`), or None when it does not answer;
    as the `elastic` user when a password is given (security on)."""
    request = urllib.request.Request(f"{url}/_cluster/health")
    if password is not None:
        token = base64.b64encode(f"elastic:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of a log, for failure messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
