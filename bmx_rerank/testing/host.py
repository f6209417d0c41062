"""Where the launcher keeps things on this machine (cache, state, Maven repository), the locks that
serialise processes, and the unprivileged user the engines run as (both refuse to run as root)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bmx_rerank.testing.kinds import EngineError, Reporter, quiet

RUN_USER = "bmxsearch"


def is_root() -> bool:
    return os.geteuid() == 0


def cache_dir() -> Path:
    """Where archives and unpacked distributions live; must be readable by the run user."""
    if os.environ.get("BMX_RERANK_CACHE"):
        return Path(os.environ["BMX_RERANK_CACHE"])
    if is_root():
        return Path("/var/cache/bmx-rerank")  # root's home is 0700: the run user could not read it
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bmx-rerank"


def state_dir() -> Path:
    """Where per-engine state and node directories live (shared between start/stop/status)."""
    if os.environ.get("BMX_RERANK_STATE"):
        return Path(os.environ["BMX_RERANK_STATE"])
    if is_root():
        return Path("/var/lib/bmx-rerank")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "bmx-rerank"


def m2_repository() -> Path:
    """Maven's local repository, where `mvn dependency:get` drops what it fetched."""
    return Path(os.environ.get("BMX_RERANK_M2_REPO") or Path.home() / ".m2" / "repository")


def makedirs_0755(path: Path) -> None:
    """Create `path` so that every created level is world-traversable (the run user needs that)."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        p.chmod(0o755)


def check_traversable(path: Path) -> None:
    """Fail early when the run user could not reach `path` (e.g. a cache under root's 0700 home)."""
    for p in [path, *path.parents]:
        with contextlib.suppress(FileNotFoundError):
            if not p.stat().st_mode & 0o001:
                raise EngineError(
                    f"{p} is not world-traversable (mode {oct(p.stat().st_mode & 0o777)}), so the "
                    f"unprivileged user {RUN_USER!r} cannot reach {path}. Set BMX_RERANK_CACHE / "
                    "BMX_RERANK_STATE to a directory outside it, e.g. under /var."
                )


@dataclass(frozen=True)
class RunAs:
    """The identity the engine process runs with (None: the current, non-root user)."""

    user: str | None
    uid: int
    gid: int


def ensure_run_user(report: Reporter = quiet) -> RunAs:
    """As root, run as the system user `bmxsearch` (created if missing); otherwise as ourselves."""
    if not is_root():
        return RunAs(None, os.getuid(), os.getgid())
    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(RUN_USER)
        return RunAs(RUN_USER, entry.pw_uid, entry.pw_gid)
    useradd = shutil.which("useradd")
    if useradd is None:
        raise EngineError(
            f"running as root, the engine needs an unprivileged user; create one: "
            f"`adduser --system --group {RUN_USER}` (useradd was not found)"
        )
    shell = shutil.which("nologin") or "/usr/sbin/nologin"
    report(f"creating system user {RUN_USER} (Elasticsearch and OpenSearch refuse to run as root)")
    cmd = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    proc = subprocess.run([*cmd, "--shell", shell, RUN_USER], capture_output=True, text=True)
    if proc.returncode not in (0, 9):  # 9: already exists (a concurrent start)
        raise EngineError(f"could not create user {RUN_USER}: {proc.stderr.strip()}")
    entry = pwd.getpwnam(RUN_USER)
    return RunAs(RUN_USER, entry.pw_uid, entry.pw_gid)


def chown_tree(root: Path, run_as: RunAs) -> None:
    if not is_root():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, run_as.uid, run_as.gid)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), run_as.uid, run_as.gid, follow_symlinks=False)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise start/stop/download between processes (e.g. CI starting both engines at once)."""
    makedirs_0755(path.parent)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
