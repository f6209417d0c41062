"""Node settings: a fresh node directory with its config (security off unless asked, small heap,
loopback only; a single node, or a member of a local cluster), the JVM options rewritten for it, its
environment and keystore."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

from bmx_rerank.testing.host import RunAs, chown_tree, makedirs_0755, state_dir
from bmx_rerank.testing.java import JavaHome
from bmx_rerank.testing.kinds import EngineError, EngineKind

HEAP = "-Xms512m -Xmx512m"


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


Settings = dict[str, str | list[str]]  # a value is a string, or a list (`node.roles`, seed hosts)

# The role that may be elected to lead the cluster, and the setting naming the first ones to elect.
MASTER_ROLE = {"elasticsearch": "master", "opensearch": "cluster_manager"}
INITIAL_MASTERS = {
    "elasticsearch": "cluster.initial_master_nodes",
    "opensearch": "cluster.initial_cluster_manager_nodes",
}


def engine_settings(kind: EngineKind, port: int, data: Path, logs: Path, security: bool = False) -> Settings:
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


def member_settings(
    kind: EngineKind,
    cluster: str,
    name: str,
    http_port: int,
    transport_port: int,
    node: Path,
    seeds: list[str],
    masters: list[str],
) -> Settings:
    """One node of a local cluster: the single node's settings, but found by its peers on fixed
    transport ports (`seeds`, host:port) and bootstrapped by the nodes named in `masters`; a node not in
    `masters` is data-only, never elected."""
    settings = engine_settings(kind, http_port, node / "data", node / "logs")
    del settings["discovery.type"]
    eligible = name in masters
    settings.update(
        {
            "cluster.name": cluster,
            "node.name": name,
            "transport.port": str(transport_port),
            "discovery.seed_hosts": seeds,
            INITIAL_MASTERS[kind]: masters,
            "node.roles": [MASTER_ROLE[kind], "data"] if eligible else ["data"],
        }
    )
    return settings


def render_yaml(settings: Settings) -> str:
    """Flat `key: "value"` (or `key: ["a", "b"]`) YAML, enough for the engines' config file."""
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in settings.items())


def single_node_dir(kind: EngineKind) -> Path:
    """Where the launcher's one engine of a kind keeps its node (config, data, logs)."""
    return state_dir() / kind / "node"


def prepare_node(kind: EngineKind, home: Path, run_as: RunAs, node: Path, settings: Settings) -> Path:
    """Fresh node dir `node` (config copy, data, logs, tmp) owned by the run user, its config file
    written from `settings`; returns its logs directory."""
    shutil.rmtree(node, ignore_errors=True)
    logs = node / "logs"
    for sub in ("data", "logs", "tmp"):
        makedirs_0755(node / sub)
    shutil.copytree(home / "config", node / "config")
    jvm_options = node / "config" / "jvm.options"
    jvm_options.write_text(rewrite_jvm_options(jvm_options.read_text(), logs))
    (node / "config" / f"{kind}.yml").write_text(render_yaml(settings))
    chown_tree(node, run_as)
    return logs


def engine_env(kind: EngineKind, java: JavaHome, node: Path, heap: str = HEAP) -> dict[str, str]:
    """The engine's environment: its JDK, config and tmp directories, heap; nothing inherited."""
    prefix = "ES" if kind == "elasticsearch" else "OPENSEARCH"
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(node),
        "LANG": "C.UTF-8",
        f"{prefix}_JAVA_HOME": str(java.path),  # ES ignores JAVA_HOME; the integ zips bundle no JDK
        f"{prefix}_PATH_CONF": str(node / "config"),
        f"{prefix}_TMPDIR": str(node / "tmp"),
        f"{prefix}_JAVA_OPTS": heap,
    }
    return env


def set_bootstrap_password(
    kind: EngineKind, password: str, home: Path, java: JavaHome, node: Path, run_as: RunAs
) -> None:
    """The `elastic` user's password, in a fresh keystore of the node (read from stdin, not argv)."""
    if kind != "elasticsearch":
        raise EngineError("a password (security on) is supported for Elasticsearch only")
    tool = str(home / "bin" / "elasticsearch-keystore")
    for args, stdin in ((["create"], None), (["add", "-x", "bootstrap.password"], password)):
        proc = subprocess.run(
            [tool, *args],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=node,
            env=engine_env(kind, java, node),
            user=run_as.uid if run_as.user else None,
            group=run_as.gid if run_as.user else None,
            extra_groups=[] if run_as.user else None,
        )
        if proc.returncode != 0:
            raise EngineError(f"elasticsearch-keystore {args[0]} failed: {proc.stdout}{proc.stderr}")
