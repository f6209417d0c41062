"""Run a real single-node Elasticsearch or OpenSearch without Docker, for tests, CI and the demo.

The engines come from the "integ-test-zip" distributions on Maven Central (the only official
builds reachable where the network allows package registries and nothing else). They are
unpacked into a shared cache, configured with security off and a small heap, bound to loopback,
and run as an unprivileged user because both engines refuse to run as root.

State (pid, url, directories) lives in a state directory, so `stop` and `status` work from
another process than `start`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

EngineKind = Literal["elasticsearch", "opensearch"]
KINDS: tuple[EngineKind, ...] = ("elasticsearch", "opensearch")

DEFAULT_VERSIONS: dict[str, str] = {"elasticsearch": "8.19.21", "opensearch": "2.19.3"}
DEFAULT_PORTS: dict[str, int] = {"elasticsearch": 9200, "opensearch": 9201}
HEAP = "-Xms512m -Xmx512m"
RUN_USER = "bmxsearch"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 40

Reporter = Callable[[str], None]


class EngineError(Exception):
    """A failure the user can act on; the message says what to do (the CLI prints it without a trace)."""


def _quiet(_: str) -> None:
    """Default progress reporter: say nothing."""


# --------------------------------------------------------------------------------------------
# Versions, artifacts, Java
# --------------------------------------------------------------------------------------------


def parse_version(version: str) -> tuple[int, int, int]:
    """Split "8.19.21" so that version rules (Java range, descriptor fields) can compare numbers."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version.strip())
    if not m:
        raise EngineError(f"version {version!r} is not of the form MAJOR.MINOR.PATCH (e.g. 8.19.21)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@dataclass(frozen=True)
class JavaRange:
    """Java feature releases an engine version runs on: minimum inclusive, maximum exclusive."""

    minimum: int
    below: int | None = None

    def accepts(self, feature: int) -> bool:
        return feature >= self.minimum and (self.below is None or feature < self.below)

    def describe(self) -> str:
        if self.below is None:
            return f"Java {self.minimum} or newer"
        return f"Java {self.minimum} to {self.below - 1}"


def java_range(kind: EngineKind, version: str) -> JavaRange:
    """Which Java an engine version needs: ES 8 >= 17, ES 9 / OpenSearch 3 >= 21, OpenSearch 2 < 24.

    OpenSearch 2.x enables the SecurityManager, which JDK 24 removed, hence the upper bound.
    """
    major = parse_version(version)[0]
    if kind == "elasticsearch":
        if major < 8:
            raise EngineError(f"Elasticsearch {version} is not supported here: use 8.x (default 8.19.21)")
        return JavaRange(17) if major == 8 else JavaRange(21)
    if major < 2:
        raise EngineError(f"OpenSearch {version} is not supported here: use 2.x or 3.x (default 2.19.3)")
    return JavaRange(11, 24) if major == 2 else JavaRange(21)


@dataclass(frozen=True)
class JavaHome:
    """A JDK found on this machine."""

    path: Path
    version: str
    feature: int
    modules: frozenset[str] = frozenset()


def read_java_home(path: Path) -> JavaHome | None:
    """Describe the JDK at `path` from its `release` file, or None when it is not a usable JDK."""
    if not (path / "bin" / "java").is_file():
        return None
    try:
        text = (path / "release").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    values = dict(re.findall(r'^([A-Z_]+)="?(.*?)"?$', text, flags=re.M))
    version = values.get("JAVA_VERSION", "")
    m = re.match(r"(?:1\.)?(\d+)", version)
    if not m:
        return None
    return JavaHome(path, version, int(m.group(1)), frozenset(values.get("MODULES", "").split()))


def find_java_homes(extra: Sequence[Path] = ()) -> list[JavaHome]:
    """All JDKs we can see (system JVM folders, JAVA_HOME, `java` on PATH), deduplicated."""
    candidates: list[Path] = list(extra)
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    for root in ("/usr/lib/jvm", "/usr/java", "/opt/java", "/usr/local/lib/jvm"):
        with contextlib.suppress(OSError):
            candidates.extend(sorted(Path(root).iterdir()))
    java = shutil.which("java")
    if java:
        candidates.append(Path(java).resolve().parent.parent)
    seen: set[Path] = set()
    found: list[JavaHome] = []
    for candidate in candidates:
        real = candidate.resolve()
        if real in seen:
            continue
        seen.add(real)
        home = read_java_home(real)
        if home is not None:
            found.append(home)
    return found


def choose_java(kind: EngineKind, version: str, homes: Sequence[JavaHome]) -> JavaHome:
    """Pick the oldest JDK the engine accepts (the best-trodden path upstream), or explain what to install."""
    wanted = java_range(kind, version)
    ok = [h for h in homes if wanted.accepts(h.feature)]
    if kind == "elasticsearch":
        # ES 8.18+/9.x self-attach an instrumentation agent ("entitlements"): needs a full JDK.
        ok = [h for h in ok if not h.modules or "jdk.attach" in h.modules]
    if ok:
        return min(ok, key=lambda h: (h.feature, str(h.path)))
    seen = ", ".join(f"{h.feature} ({h.path})" for h in homes) or "none"
    package = "openjdk-17-jdk-headless" if wanted.accepts(17) else "openjdk-21-jdk-headless"
    raise EngineError(
        f"{kind} {version} needs {wanted.describe()} (a full JDK); found: {seen}. "
        f"Install one (e.g. `apt-get install {package}`) or pass --java-home / set BMX_RERANK_JAVA_HOME."
    )


@dataclass(frozen=True)
class Artifact:
    """A Maven Central coordinate and where Maven puts it in the local repository."""

    group: str
    artifact: str
    version: str
    packaging: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}:{self.packaging}"

    @property
    def filename(self) -> str:
        return f"{self.artifact}-{self.version}.{self.packaging}"

    def local_path(self, m2_repo: Path) -> Path:
        return m2_repo.joinpath(*self.group.split("."), self.artifact, self.version, self.filename)


def distribution_artifact(kind: EngineKind, version: str) -> Artifact:
    """The integ-test-zip: the minimal, JDK-less distribution each project publishes to Maven Central."""
    group = "org.elasticsearch" if kind == "elasticsearch" else "org.opensearch"
    return Artifact(f"{group}.distribution.integ-test-zip", kind, version, "zip")


def analysis_common_artifact(version: str) -> Artifact:
    """OpenSearch's analysis-common module as a plain jar (the integ zip lacks `english` and stemmers)."""
    return Artifact("org.opensearch.plugin", "analysis-common", version, "jar")


# --------------------------------------------------------------------------------------------
# Pure file rewriting
# --------------------------------------------------------------------------------------------

_JVM_PATH_OPTIONS = (
    re.compile(r"(-XX:HeapDumpPath=)(\S+)"),
    re.compile(r"(-XX:ErrorFile=)(\S+)"),
    re.compile(r"(-Xloggc:)(\S+)"),
    re.compile(r"(-Xlog:\S*?:file=)([^:\s]+)"),
)


def rewrite_jvm_options(text: str, logs_dir: Path) -> str:
    """Point relative log/dump paths in jvm.options at `logs_dir`.

    They resolve against the distribution directory, which the run user cannot write; the launcher's
    first `java -XX:+PrintFlagsFinal` with these options would then die before the engine starts.
    """

    def fix(match: re.Match[str]) -> str:
        prefix, value = match.group(1), match.group(2)
        if value.startswith("/") or "${" in value:
            return match.group(0)
        if prefix == "-XX:HeapDumpPath=" and "." not in Path(value).name:
            return prefix + str(logs_dir)  # a directory ("data")
        return prefix + str(logs_dir / Path(value).name)

    out = []
    for line in text.splitlines(keepends=True):
        if not line.lstrip().startswith("#"):
            for pattern in _JVM_PATH_OPTIONS:
                line = pattern.sub(fix, line)
        out.append(line)
    return "".join(out)


def plugin_classname(jar_names: Sequence[str]) -> str:
    """The analysis-common plugin class: renamed between OpenSearch 2.x and 3.x, so read it from the jar."""
    for name in ("CommonAnalysisModulePlugin", "CommonAnalysisPlugin"):
        if f"org/opensearch/analysis/common/{name}.class" in jar_names:
            return f"org.opensearch.analysis.common.{name}"
    raise EngineError("analysis-common jar has neither CommonAnalysisModulePlugin nor CommonAnalysisPlugin")


def plugin_descriptor(version: str, classname: str) -> str:
    """plugin-descriptor.properties for analysis-common installed as a module.

    `extended.plugins=lang-painless` is left out on purpose: painless is absent from the integ zip
    and would be a fatal missing dependency; it only matters for script-based token filters.
    Unknown keys are fatal to OpenSearch, so only the documented ones are written.
    """
    java_version = "11" if parse_version(version)[0] < 3 else "21"
    return (
        "name=analysis-common\n"
        'description=Adds "built in" analyzers to OpenSearch.\n'
        f"version={version}\n"
        f"opensearch.version={version}\n"
        f"java.version={java_version}\n"
        f"classname={classname}\n"
    )


def engine_settings(
    kind: EngineKind, port: int, data: Path, logs: Path, security: bool = False
) -> dict[str, str]:
    """Node settings: single node on loopback, no security (unless asked, ES only: users and roles, HTTP
    without TLS, allowed on a single loopback node), tiny-disk friendly, wildcard deletes allowed."""
    settings = {
        "cluster.name": f"bmx-rerank-{kind}",
        "node.name": f"bmx-rerank-{kind}",
        "discovery.type": "single-node",
        "network.host": "127.0.0.1",
        "http.port": str(port),
        "transport.port": "0",
        "node.portsfile": "true",
        "path.data": str(data),
        "path.logs": str(logs),
        "cluster.routing.allocation.disk.watermark.low": "1b",
        "cluster.routing.allocation.disk.watermark.high": "1b",
        "cluster.routing.allocation.disk.watermark.flood_stage": "1b",
        "indices.breaker.total.use_real_memory": "false",
        "action.destructive_requires_name": "false",
    }
    if kind == "elasticsearch":
        # Explicitly set, or the CLI's security auto-configuration turns on TLS + auth.
        settings["xpack.security.enabled"] = "true" if security else "false"
        if security:
            settings["xpack.security.http.ssl.enabled"] = "false"
            settings["xpack.security.transport.ssl.enabled"] = "false"
            # Users and roles come from the file realm (config/users, users_roles, roles.yml): the
            # integ zip lacks analysis-common, which the native realm's .security index needs.
            settings["resource.reload.interval.high"] = "1s"
    # OpenSearch: no plugins.security.* here, the plugin is absent and unknown settings are fatal.
    return settings


def render_yaml(settings: dict[str, str]) -> str:
    """Flat `key: "value"` YAML, enough for the engines' config file."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items())


def classify_maven_failure(output: str, artifact: Artifact) -> EngineError:
    """Turn Maven's output into an actionable message (not published vs. download refused)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", output)
    if re.search(r"Could not find artifact|Failure to find|was not found in", text):
        hint = ""
        if artifact.group.startswith("org.elasticsearch.distribution") and artifact.version.startswith("9."):
            hint = " Elastic does not publish the 9.x integ-test-zip to Maven Central; use 8.19.21."
        return EngineError(
            f"{artifact.coordinate} is not on Maven Central.{hint} "
            "Pick a published version with --version (see docs/engines.md)."
        )
    errors = [line for line in text.splitlines() if line.startswith("[ERROR]") and len(line) > 12]
    detail = "\n".join((errors or text.strip().splitlines())[:3])
    return EngineError(
        f"Maven could not download {artifact.coordinate}. Check access to Maven Central "
        f"(proxy, ~/.m2/settings.xml mirrors) or place the file in the cache yourself.\n{detail}"
    )


# --------------------------------------------------------------------------------------------
# Directories and users
# --------------------------------------------------------------------------------------------


def _is_root() -> bool:
    return os.geteuid() == 0


def cache_dir() -> Path:
    """Where archives and unpacked distributions live; must be readable by the run user."""
    if os.environ.get("BMX_RERANK_CACHE"):
        return Path(os.environ["BMX_RERANK_CACHE"])
    if _is_root():
        return Path("/var/cache/bmx-rerank")  # root's home is 0700: the run user could not read it
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bmx-rerank"


def state_dir() -> Path:
    """Where per-engine state and node directories live (shared between start/stop/status)."""
    if os.environ.get("BMX_RERANK_STATE"):
        return Path(os.environ["BMX_RERANK_STATE"])
    if _is_root():
        return Path("/var/lib/bmx-rerank")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "bmx-rerank"


def m2_repository() -> Path:
    """Maven's local repository, where `mvn dependency:get` drops what it fetched."""
    return Path(os.environ.get("BMX_RERANK_M2_REPO") or Path.home() / ".m2" / "repository")


def _makedirs_0755(path: Path) -> None:
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


def ensure_run_user(report: Reporter = _quiet) -> RunAs:
    """As root, run as the system user `bmxsearch` (created if missing); otherwise as ourselves."""
    if not _is_root():
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


def _chown_tree(root: Path, run_as: RunAs) -> None:
    if not _is_root():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, run_as.uid, run_as.gid)
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), run_as.uid, run_as.gid, follow_symlinks=False)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise start/stop/download between processes (e.g. CI starting both engines at once)."""
    _makedirs_0755(path.parent)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Download and unpack
# --------------------------------------------------------------------------------------------


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_artifact(artifact: Artifact, dest_dir: Path, report: Reporter = _quiet) -> Path:
    """Return `dest_dir/<file>`, copying it from ~/.m2 and running Maven first when needed."""
    dest = dest_dir / artifact.filename
    if dest.is_file():
        return dest
    local = artifact.local_path(m2_repository())
    if not local.is_file():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise EngineError(
                f"no cached {artifact.filename} (looked in {dest_dir} and {local.parent}) and no Maven "
                f"to download it: `apt-get install maven`, or copy the file to {dest}"
            )
        report(f"downloading {artifact.coordinate} from Maven Central")
        cmd = [mvn, "-B", "-q", "dependency:get", "-Dtransitive=false", f"-Dartifact={artifact.coordinate}"]
        # Java's user.home comes from passwd, not $HOME: name the repository so we look where Maven writes.
        cmd.append(f"-Dmaven.repo.local={m2_repository()}")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            raise EngineError(f"Maven took over 30 min to download {artifact.coordinate}") from None
        if proc.returncode != 0 or not local.is_file():
            raise classify_maven_failure(proc.stdout + proc.stderr, artifact)
    checksum = local.with_name(local.name + ".sha1")
    if checksum.is_file():
        words = checksum.read_text().split()
        if words and words[0].lower() != _sha1(local):
            raise EngineError(f"{local} does not match its .sha1: delete it and run again to re-download")
    _makedirs_0755(dest_dir)
    tmp = dest.with_name(dest.name + f".part{os.getpid()}")
    shutil.copyfile(local, tmp)
    tmp.chmod(0o644)
    tmp.replace(dest)
    return dest


def _unzip(archive: Path, into: Path) -> None:
    """Extract keeping the +x bits (Python's zipfile drops them)."""
    unzip = shutil.which("unzip")
    if unzip:
        proc = subprocess.run(
            [unzip, "-q", "-o", str(archive), "-d", str(into)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise EngineError(f"unzip {archive} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, into))
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                path.chmod(mode)


def _make_world_readable(root: Path) -> None:
    """The archive's config/ is 0750/0660; the run user must read the whole distribution."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)


def install_analysis_common(home: Path, version: str, cache: Path, report: Reporter = _quiet) -> None:
    """Add OpenSearch's analysis-common jar as a module (jar + our descriptor) for `english` & co."""
    jar = fetch_artifact(analysis_common_artifact(version), cache / "archives", report)
    module = home / "modules" / "analysis-common"
    module.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(jar, module / jar.name)
    with zipfile.ZipFile(jar) as zf:
        classname = plugin_classname(zf.namelist())
    (module / "plugin-descriptor.properties").write_text(plugin_descriptor(version, classname))


def ensure_distribution(kind: EngineKind, version: str, report: Reporter = _quiet) -> Path:
    """Return the unpacked distribution's home, downloading and unpacking it once into the cache."""
    cache = cache_dir()
    if _is_root():
        _makedirs_0755(cache)
        check_traversable(cache)
    home = cache / "dists" / f"{kind}-{version}"
    if (home / "bin" / kind).is_file():
        return home
    with _locked(cache / f".{kind}-{version}.lock"):
        if (home / "bin" / kind).is_file():
            return home
        archive = fetch_artifact(distribution_artifact(kind, version), cache / "archives", report)
        report(f"unpacking {archive.name}")
        staging = cache / "dists" / f".{kind}-{version}.unpack{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        _makedirs_0755(staging)
        _unzip(archive, staging)
        top = staging / f"{kind}-{version}"
        if not (top / "bin" / kind).is_file():
            raise EngineError(f"{archive} does not contain {kind}-{version}/bin/{kind}: delete it and retry")
        if kind == "opensearch":
            install_analysis_common(top, version, cache, report)
        if parse_version(version)[0] >= 3 and kind == "opensearch" and not (top / "agent").is_dir():
            raise EngineError(f"{archive} has no agent/ directory, which OpenSearch 3.x needs to start")
        _make_world_readable(top)
        shutil.rmtree(home, ignore_errors=True)
        top.replace(home)
        shutil.rmtree(staging, ignore_errors=True)
    return home


# --------------------------------------------------------------------------------------------
# Processes and state
# --------------------------------------------------------------------------------------------


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


def _state_file(kind: str) -> Path:
    return state_dir() / kind / "state.json"


def load_state(kind: str) -> EngineState | None:
    """The recorded engine of this kind, if any (it may have died since)."""
    try:
        data = json.loads(_state_file(kind).read_text())
        return EngineState(**data)
    except (OSError, ValueError, TypeError):
        return None


def _save_state(state: EngineState) -> None:
    path = _state_file(state.kind)
    _makedirs_0755(path.parent)
    tmp = path.with_name(f"state.json.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def _proc_start_ticks(pid: int) -> int | None:
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
    return _proc_start_ticks(state.pid) == state.start_ticks


def _group_alive(pgid: int) -> bool:
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
        if not _group_alive(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(50):
        _reap(pgid)
        if not _group_alive(pgid):
            return
        time.sleep(0.1)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on host:port (the engines also set SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


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


def _prepare_node(req: StartRequest, home: Path, run_as: RunAs) -> tuple[Path, Path]:
    """Fresh node dir (config copy, data, logs, tmp) owned by the run user; returns (node, logs)."""
    node = state_dir() / req.kind / "node"
    shutil.rmtree(node, ignore_errors=True)
    logs = node / "logs"
    for sub in ("data", "logs", "tmp"):
        _makedirs_0755(node / sub)
    shutil.copytree(home / "config", node / "config")
    jvm_options = node / "config" / "jvm.options"
    jvm_options.write_text(rewrite_jvm_options(jvm_options.read_text(), logs))
    yml = node / "config" / f"{req.kind}.yml"
    security = req.password is not None
    yml.write_text(render_yaml(engine_settings(req.kind, req.port, node / "data", logs, security)))
    _chown_tree(node, run_as)
    return node, logs


def _engine_env(req: StartRequest, java: JavaHome, node: Path) -> dict[str, str]:
    prefix = "ES" if req.kind == "elasticsearch" else "OPENSEARCH"
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(node),
        "LANG": "C.UTF-8",
        f"{prefix}_JAVA_HOME": str(java.path),  # ES ignores JAVA_HOME; the integ zips bundle no JDK
        f"{prefix}_PATH_CONF": str(node / "config"),
        f"{prefix}_TMPDIR": str(node / "tmp"),
        f"{prefix}_JAVA_OPTS": HEAP,
    }
    return env


def _set_bootstrap_password(req: StartRequest, home: Path, java: JavaHome, node: Path, run_as: RunAs) -> None:
    """The `elastic` user's password, in a fresh keystore of the node (read from stdin, not argv)."""
    if req.kind != "elasticsearch":
        raise EngineError("a password (security on) is supported for Elasticsearch only")
    tool = str(home / "bin" / "elasticsearch-keystore")
    for args, stdin in ((["create"], None), (["add", "-x", "bootstrap.password"], req.password)):
        proc = subprocess.run(
            [tool, *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=node,
            env=_engine_env(req, java, node),
            user=run_as.uid if run_as.user else None,
            group=run_as.gid if run_as.user else None,
            extra_groups=[] if run_as.user else None,
        )
        if proc.returncode != 0:
            raise EngineError(f"elasticsearch-keystore {args[0]} failed: {proc.stdout}{proc.stderr}")


def _java_candidates(java_home: Path | None) -> list[JavaHome]:
    """--java-home, else $BMX_RERANK_JAVA_HOME, else every JDK on the machine."""
    explicit = java_home or (
        Path(os.environ["BMX_RERANK_JAVA_HOME"]) if os.environ.get("BMX_RERANK_JAVA_HOME") else None
    )
    if explicit is None:
        return find_java_homes()
    found = read_java_home(explicit)
    if found is None:
        raise EngineError(f"{explicit} is not a JDK (it needs bin/java and a release file)")
    return [found]


def start(req: StartRequest, report: Reporter = _quiet) -> EngineState:
    """Start the engine (or find it running) and return its state once /_cluster/health answers."""
    with _locked(state_dir() / f".{req.kind}.lock"):
        current = load_state(req.kind)
        if current is not None and is_alive(current):
            if current.version != req.version or current.port != req.port:
                report(
                    f"{req.kind} {current.version} is already running on port {current.port}; "
                    f"run `bmx-rerank engine stop {req.kind}` first to change version or port"
                )
            return current
        java = choose_java(req.kind, req.version, _java_candidates(req.java_home))
        if port_in_use(req.port):
            raise EngineError(
                f"port {req.port} on 127.0.0.1 is already in use by another process. Choose another "
                f"with --port, or find the user with `ss -ltnp 'sport = :{req.port}'`."
            )
        home = ensure_distribution(req.kind, req.version, report)
        run_as = ensure_run_user(report)
        if _is_root():
            check_traversable(state_dir())
        node, logs = _prepare_node(req, home, run_as)
        if req.password is not None:
            _set_bootstrap_password(req, home, java, node, run_as)
        console = logs / "console.log"
        report(f"starting {req.kind} {req.version} on 127.0.0.1:{req.port} with Java {java.version}")
        started = time.monotonic()
        with open(console, "ab") as out:
            if _is_root():
                os.chown(console, run_as.uid, run_as.gid)
            proc = subprocess.Popen(
                [str(home / "bin" / req.kind)],
                cwd=node,
                env=_engine_env(req, java, node),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=run_as.uid if run_as.user else None,
                group=run_as.gid if run_as.user else None,
                extra_groups=[] if run_as.user else None,
            )
        url = f"http://127.0.0.1:{req.port}"
        try:  # until the state is saved, `stop` could not find this engine: never leave it running
            _wait_ready(req, proc, url, console)
            state = EngineState(
                kind=req.kind,
                version=req.version,
                url=url,
                port=req.port,
                pid=proc.pid,
                start_ticks=_proc_start_ticks(proc.pid) or 0,
                node_dir=str(node),
                console_log=str(console),
                java_home=str(java.path),
                home=str(home),
                user=run_as.user,
                startup_seconds=round(time.monotonic() - started, 1),
            )
            try:
                _save_state(state)
            except OSError as exc:
                raise EngineError(
                    f"could not record the engine's state in {_state_file(req.kind)}: {exc}"
                ) from exc
        except BaseException:
            kill_group(proc.pid, timeout=10)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            raise
        report(f"{req.kind} {req.version} is up after {state.startup_seconds:.1f}s (logs: {logs})")
        return state


def _wait_ready(req: StartRequest, proc: subprocess.Popen[bytes], url: str, console: Path) -> None:
    """Poll /_cluster/health until yellow/green, failing fast if the engine process exits."""
    deadline = time.monotonic() + req.timeout
    expected_cluster = engine_settings(req.kind, req.port, Path(), Path())["cluster.name"]
    while True:
        code = proc.poll()
        if code is not None:
            raise EngineError(
                f"{req.kind} exited with code {code} during start. Last lines of {console}:\n{tail(console)}"
            )
        health = cluster_health(url, password=req.password)
        if health and health.get("status") in ("yellow", "green"):
            if health.get("cluster_name") != expected_cluster:
                raise EngineError(
                    f"{url} answers as cluster {health.get('cluster_name')!r}, not ours: another "
                    f"engine grabbed port {req.port}; choose another with --port"
                )
            return
        if time.monotonic() > deadline:
            raise EngineError(
                f"{req.kind} did not become ready within {req.timeout:.0f}s (try --timeout). "
                f"Last lines of {console}:\n{tail(console)}"
            )
        time.sleep(0.5)


def stop(kind: EngineKind, report: Reporter = _quiet) -> bool:
    """Stop the recorded engine; True if one was running. Its node directory (data) is discarded."""
    with _locked(state_dir() / f".{kind}.lock"):
        state = load_state(kind)
        if state is None:
            return False
        running = is_alive(state)
        if running:
            report(f"stopping {kind} (pid {state.pid})")
            kill_group(state.pid)
        _state_file(kind).unlink(missing_ok=True)
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
    "Artifact",
    "EngineError",
    "EngineKind",
    "EngineState",
    "EngineStatus",
    "JavaHome",
    "JavaRange",
    "StartRequest",
    "choose_java",
    "classify_maven_failure",
    "default_reporter",
    "engine_settings",
    "ensure_distribution",
    "find_java_homes",
    "java_range",
    "plugin_classname",
    "plugin_descriptor",
    "rewrite_jvm_options",
    "start",
    "status",
    "stop",
]
