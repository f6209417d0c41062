"""Run a real single-node Elasticsearch or OpenSearch without Docker, for tests, CI and the demo: the
public start / stop / status.

The engines come from Maven Central (`artifacts`), are unpacked into a shared cache, configured with
security off and a small heap, bound to loopback (`node`), and run as an unprivileged user (`host`)
because both engines refuse to run as root. State (pid, url, directories) lives in a state directory
(`process`), so `stop` and `status` work from another process than `start`.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bmx_rerank.testing import host
from bmx_rerank.testing.artifacts import ensure_distribution
from bmx_rerank.testing.host import check_traversable, ensure_run_user, locked, state_dir
from bmx_rerank.testing.java import choose_java, java_candidates
from bmx_rerank.testing.kinds import (
    DEFAULT_PORTS,
    DEFAULT_VERSIONS,
    KINDS,
    EngineError,
    EngineKind,
    Reporter,
    quiet,
)
from bmx_rerank.testing.node import (
    engine_env,
    engine_settings,
    prepare_node,
    set_bootstrap_password,
    single_node_dir,
)
from bmx_rerank.testing.process import (
    EngineState,
    Launched,
    cluster_health,
    is_alive,
    kill_group,
    load_state,
    port_in_use,
    proc_start_ticks,
    save_state,
    spawn,
    state_file,
    wait_healthy,
)

START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class StartRequest:
    """What `engine start` was asked for."""

    kind: EngineKind
    version: str
    port: int
    java_home: Path | None = None
    timeout: float = START_TIMEOUT_S
    # Elasticsearch only: security on, with this password for the built-in `elastic` superuser (set as
    # `bootstrap.password` in the node's keystore; never written to the state file).
    password: str | None = field(default=None, repr=False)


def start(req: StartRequest, report: Reporter = quiet) -> EngineState:
    """Start the engine (or find it running) and return its state once /_cluster/health answers."""
    with locked(state_dir() / f".{req.kind}.lock"):
        current = load_state(req.kind)
        if current is not None and is_alive(current):
            if current.version != req.version or current.port != req.port:
                report(
                    f"{req.kind} {current.version} is already running on port {current.port}; "
                    f"run `bmx-rerank engine stop {req.kind}` first to change version or port"
                )
            return current
        java = choose_java(req.kind, req.version, java_candidates(req.java_home))
        if port_in_use(req.port):
            raise EngineError(
                f"port {req.port} on 127.0.0.1 is already in use by another process. Choose another "
                f"with --port, or find the user with `ss -ltnp 'sport = :{req.port}'`."
            )
        home = ensure_distribution(req.kind, req.version, report)
        run_as = ensure_run_user(report)
        if host.is_root():
            check_traversable(state_dir())
        node = single_node_dir(req.kind)
        settings = engine_settings(req.kind, req.port, node / "data", node / "logs", req.password is not None)
        logs = prepare_node(req.kind, home, run_as, node, settings)
        if req.password is not None:
            set_bootstrap_password(req.kind, req.password, home, java, node, run_as)
        console = logs / "console.log"
        report(f"starting {req.kind} {req.version} on 127.0.0.1:{req.port} with Java {java.version}")
        started = time.monotonic()
        proc = spawn([str(home / "bin" / req.kind)], node, engine_env(req.kind, java, node), console, run_as)
        url = f"http://127.0.0.1:{req.port}"
        try:  # until the state is saved, `stop` could not find this engine: never leave it running
            launched = [Launched(req.kind, proc, console)]
            wait_healthy(url, launched, str(settings["cluster.name"]), req.timeout, password=req.password)
            state = EngineState(
                kind=req.kind,
                version=req.version,
                url=url,
                port=req.port,
                pid=proc.pid,
                start_ticks=proc_start_ticks(proc.pid) or 0,
                node_dir=str(node),
                console_log=str(console),
                java_home=str(java.path),
                home=str(home),
                user=run_as.user,
                startup_seconds=round(time.monotonic() - started, 1),
            )
            try:
                save_state(state)
            except OSError as exc:
                raise EngineError(
                    f"could not record the engine's state in {state_file(req.kind)}: {exc}"
                ) from exc
        except BaseException:
            kill_group(proc.pid, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            raise
        report(f"{req.kind} {req.version} is up after {state.startup_seconds:.1f}s (logs: {logs})")
        return state


def stop(kind: EngineKind, report: Reporter = quiet) -> bool:
    """Stop the recorded engine; True if one was running. Its node directory (data) is discarded."""
    with locked(state_dir() / f".{kind}.lock"):
        state = load_state(kind)
        if state is None:
            return False
        running = is_alive(state)
        if running:
            report(f"stopping {kind} (pid {state.pid})")
            kill_group(state.pid)
        state_file(kind).unlink(missing_ok=True)
        return running


@dataclass(frozen=True)
class EngineStatus:
    """What `engine status` shows for one engine."""

    kind: str
    running: bool
    state: EngineState | None
    health: str | None


def status(kind: EngineKind) -> EngineStatus:
    """Is the recorded engine alive, and what does its cluster health say?"""
    state = load_state(kind)
    if state is None or not is_alive(state):
        return EngineStatus(kind, False, state, None)
    health = cluster_health(state.url)
    return EngineStatus(kind, True, state, str(health.get("status")) if health else None)


def default_reporter(message: str) -> None:
    """Progress goes to stderr so stdout can end with just the URL."""
    print(message, file=sys.stderr, flush=True)


__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_VERSIONS",
    "KINDS",
    "START_TIMEOUT_S",
    "EngineError",
    "EngineKind",
    "EngineState",
    "EngineStatus",
    "StartRequest",
    "default_reporter",
    "start",
    "status",
    "stop",
]
