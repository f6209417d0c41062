"""The engine launcher's pure parts, and its process handling against fake (JVM-free) distributions."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bmx_rerank.cli import main
from bmx_rerank.testing import artifacts, host, java, process
from bmx_rerank.testing import cluster as local
from bmx_rerank.testing import engine as eng
from bmx_rerank.testing import node as node_config
from tests.support.net import free_port

# Verbatim lines from the real integ-test-zip jvm.options files.
OS_219_JVM = """\
-Xms1g
-Xmx1g
## specify an alternative path for heap dumps
-XX:HeapDumpPath=data
-XX:ErrorFile=logs/hs_err_pid%p.log
8:-Xloggc:logs/gc.log
9-:-Xlog:gc*,gc+age=trace,safepoint:file=logs/gc.log:utctime,pid,tags:filecount=32,filesize=64m
-Djava.io.tmpdir=${OPENSEARCH_TMPDIR}
"""
ES_819_JVM = """\
-Djava.io.tmpdir=${ES_TMPDIR}
-XX:+HeapDumpOnOutOfMemoryError
-XX:ErrorFile=hs_err_pid%p.log
-Xlog:gc*,gc+age=trace,safepoint:file=gc.log:utctime,level,pid,tags:filecount=32,filesize=64m
# -XX:HeapDumpPath=/heap/dump/path
"""


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def test_rewrite_jvm_options_makes_log_paths_absolute() -> None:
    logs = Path("/n/logs")
    out = node_config.rewrite_jvm_options(OS_219_JVM, logs)
    assert "-XX:HeapDumpPath=/n/logs\n" in out
    assert "-XX:ErrorFile=/n/logs/hs_err_pid%p.log\n" in out
    assert "8:-Xloggc:/n/logs/gc.log\n" in out
    assert "9-:-Xlog:gc*,gc+age=trace,safepoint:file=/n/logs/gc.log:utctime,pid,tags:filecount=32" in out
    assert "-Djava.io.tmpdir=${OPENSEARCH_TMPDIR}\n" in out  # env placeholders untouched
    assert "-Xms1g\n" in out and "## specify an alternative path for heap dumps\n" in out

    es = node_config.rewrite_jvm_options(ES_819_JVM, logs)
    assert "-XX:ErrorFile=/n/logs/hs_err_pid%p.log\n" in es
    assert "safepoint:file=/n/logs/gc.log:utctime,level" in es
    assert "# -XX:HeapDumpPath=/heap/dump/path\n" in es  # comments untouched
    assert node_config.rewrite_jvm_options(es, logs) == es  # absolute paths stay as they are


def test_plugin_classname_is_read_from_the_jar() -> None:
    names_2x = ["META-INF/MANIFEST.MF", "org/opensearch/analysis/common/CommonAnalysisPlugin.class"]
    names_3x = ["org/opensearch/analysis/common/CommonAnalysisModulePlugin.class"]
    common = artifacts.OPENSEARCH_MODULES[0]
    assert (
        artifacts.plugin_classname(names_2x, common) == "org.opensearch.analysis.common.CommonAnalysisPlugin"
    )
    assert (
        artifacts.plugin_classname(names_3x, common)
        == "org.opensearch.analysis.common.CommonAnalysisModulePlugin"
    )
    with pytest.raises(eng.EngineError, match="neither"):
        artifacts.plugin_classname(["org/opensearch/Other.class"], common)


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_plugin_descriptor_has_only_known_keys_and_no_painless_dependency() -> None:
    props = _properties(
        artifacts.plugin_descriptor(
            "2.19.3", "org.opensearch.analysis.common.CommonAnalysisPlugin", artifacts.OPENSEARCH_MODULES[0]
        )
    )
    assert set(props) == {"name", "description", "version", "opensearch.version", "java.version", "classname"}
    assert props["opensearch.version"] == props["version"] == "2.19.3"
    assert props["java.version"] == "11"
    assert props["classname"] == "org.opensearch.analysis.common.CommonAnalysisPlugin"
    assert props["name"] == "analysis-common"
    assert (
        _properties(artifacts.plugin_descriptor("3.6.0", "x.Y", artifacts.OPENSEARCH_MODULES[0]))[
            "java.version"
        ]
        == "21"
    )


def test_each_added_module_names_its_own_class_descriptor_and_policy() -> None:
    painless, extras = artifacts.OPENSEARCH_MODULES[1], artifacts.OPENSEARCH_MODULES[2]
    assert (
        artifacts.plugin_classname(["org/opensearch/painless/PainlessPlugin.class"], painless)
        == "org.opensearch.painless.PainlessPlugin"
    )
    assert (
        artifacts.plugin_classname(["org/opensearch/index/mapper/MapperExtrasModulePlugin.class"], extras)
        == "org.opensearch.index.mapper.MapperExtrasModulePlugin"
    )
    with pytest.raises(eng.EngineError, match="mapper-extras-client jar has neither"):
        artifacts.plugin_classname(["org/opensearch/painless/PainlessPlugin.class"], extras)
    props = _properties(
        artifacts.plugin_descriptor("2.19.3", "org.opensearch.painless.PainlessPlugin", painless)
    )
    assert props["name"] == "lang-painless" and props["classname"] == "org.opensearch.painless.PainlessPlugin"
    assert artifacts.security_policy(painless) == (
        "grant {\n"
        '  permission java.lang.RuntimePermission "createClassLoader";\n'
        '  permission java.lang.RuntimePermission "getClassLoader";\n'
        "};\n"
    )
    assert extras.jar("3.3.2").coordinate == "org.opensearch.plugin:mapper-extras-client:3.3.2:jar"
    assert painless.pom("2.19.3").filename == "lang-painless-2.19.3.pom"


LANG_PAINLESS_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <groupId>org.opensearch.plugin</groupId><artifactId>lang-painless</artifactId><version>2.19.3</version>
  <dependencies>
    <dependency><groupId>org.antlr</groupId><artifactId>antlr4-runtime</artifactId>
      <version>4.13.1</version><scope>compile</scope></dependency>
    <dependency><groupId>org.ow2.asm</groupId><artifactId>asm</artifactId><version>9.7</version></dependency>
    <dependency><groupId>junit</groupId><artifactId>junit</artifactId><version>4.13</version>
      <scope>test</scope></dependency>
    <dependency><groupId>x</groupId><artifactId>opt</artifactId><version>1</version>
      <optional>true</optional></dependency>
  </dependencies>
</project>"""


def test_a_modules_libraries_are_what_its_pom_runs_with() -> None:
    libraries = artifacts.pom_libraries(LANG_PAINLESS_POM)
    assert [a.coordinate for a in libraries] == [
        "org.antlr:antlr4-runtime:4.13.1:jar",
        "org.ow2.asm:asm:9.7:jar",
    ]
    assert artifacts.pom_libraries("<project><dependencies/></project>") == []


def test_missing_modules_are_those_without_a_descriptor(tmp_path: Path) -> None:
    assert artifacts.missing_modules("elasticsearch", tmp_path) == []
    everything = [m.name for m in artifacts.OPENSEARCH_MODULES]
    assert [m.name for m in artifacts.missing_modules("opensearch", tmp_path)] == everything
    (tmp_path / "modules" / "analysis-common").mkdir(parents=True)
    (tmp_path / "modules" / "analysis-common" / "plugin-descriptor.properties").write_text("name=x\n")
    (tmp_path / "modules" / "lang-painless").mkdir()  # a directory alone is no module
    assert [m.name for m in artifacts.missing_modules("opensearch", tmp_path)] == everything[1:]


def _jdk(feature: int, modules: str = "java.base jdk.attach") -> java.JavaHome:
    return java.JavaHome(Path(f"/jvm/{feature}"), f"{feature}.0.1", feature, frozenset(modules.split()))


@pytest.mark.parametrize(
    ("kind", "version", "expected"),
    [
        ("elasticsearch", "8.19.21", 17),
        ("elasticsearch", "9.3.0", 25),
        ("opensearch", "2.19.3", 17),
        ("opensearch", "3.6.0", 25),
    ],
)
def test_choose_java_picks_the_oldest_accepted_jdk(kind: eng.EngineKind, version: str, expected: int) -> None:
    assert java.choose_java(kind, version, [_jdk(25), _jdk(17)]).feature == expected


def test_choose_java_explains_what_is_missing() -> None:
    with pytest.raises(eng.EngineError, match=r"opensearch 2\.19\.3 needs Java 11 to 23.*found: 25"):
        java.choose_java("opensearch", "2.19.3", [_jdk(25)])
    with pytest.raises(eng.EngineError, match=r"needs Java 21 or newer.*openjdk-21-jdk-headless"):
        java.choose_java("elasticsearch", "9.3.0", [_jdk(17)])
    with pytest.raises(eng.EngineError, match="found: none"):
        java.choose_java("elasticsearch", "8.19.21", [])
    # ES self-attaches its entitlement agent: a JRE without jdk.attach does not do.
    with pytest.raises(eng.EngineError, match="full JDK"):
        java.choose_java("elasticsearch", "8.19.21", [_jdk(17, "java.base")])
    with pytest.raises(eng.EngineError, match="MAJOR.MINOR.PATCH"):
        java.java_range("elasticsearch", "8.19")


def test_read_java_home_parses_the_release_file(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("")
    assert java.read_java_home(tmp_path) is None  # no release file
    (tmp_path / "release").write_text('JAVA_VERSION="1.8.0_402"\nMODULES="java.base"\n')
    assert java.read_java_home(tmp_path) == java.JavaHome(tmp_path, "1.8.0_402", 8, frozenset({"java.base"}))


def test_artifacts_and_their_maven_paths() -> None:
    es = artifacts.distribution_artifact("elasticsearch", "8.19.21")
    assert es.coordinate == "org.elasticsearch.distribution.integ-test-zip:elasticsearch:8.19.21:zip"
    assert es.local_path(Path("/m2")) == Path(
        "/m2/org/elasticsearch/distribution/integ-test-zip/elasticsearch/8.19.21/elasticsearch-8.19.21.zip"
    )
    assert (
        artifacts.OPENSEARCH_MODULES[0].jar("2.19.3").coordinate
        == "org.opensearch.plugin:analysis-common:2.19.3:jar"
    )


def test_classify_maven_failure() -> None:
    es9 = artifacts.distribution_artifact("elasticsearch", "9.3.0")
    cached = (
        "[ERROR] Failed ... zip:9.3.0 was not found in https://repo.maven.apache.org/maven2 during a previous"
    )
    message = str(artifacts.classify_maven_failure(cached, es9))
    assert "not on Maven Central" in message and "does not publish the 9.x integ-test-zip" in message
    os2 = artifacts.distribution_artifact("opensearch", "2.0.99")
    message = str(artifacts.classify_maven_failure("[ERROR] Could not find artifact org.opensearch...", os2))
    assert "not on Maven Central" in message and "9.x" not in message
    refused = "[ERROR] Failed to transfer file ... status code: 403, reason phrase: Forbidden (403)\n"
    message = str(artifacts.classify_maven_failure(refused, os2))
    assert "could not download" in message and "403" in message and "settings.xml" in message


def test_engine_settings_security_only_on_elasticsearch() -> None:
    es = node_config.engine_settings("elasticsearch", 9200, Path("/d"), Path("/l"))
    os_ = node_config.engine_settings("opensearch", 9201, Path("/d"), Path("/l"))
    assert es["xpack.security.enabled"] == "false"
    assert not [k for k in os_ if "security" in k or k.startswith("xpack")]  # unknown settings are fatal
    for settings, port in ((es, "9200"), (os_, "9201")):
        assert settings["network.host"] == "127.0.0.1" and settings["http.port"] == port
        assert settings["discovery.type"] == "single-node"
        assert settings["cluster.routing.allocation.disk.watermark.flood_stage"] == "1b"
    assert node_config.render_yaml({"a.b": "1b"}) == 'a.b: "1b"\n'


def test_check_traversable_rejects_a_private_parent(tmp_path: Path) -> None:
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    with pytest.raises(eng.EngineError, match="BMX_RERANK_CACHE"):
        host.check_traversable(private / "cache")


# --------------------------------------------------------------------------------------------
# Fetching archives
# --------------------------------------------------------------------------------------------


def test_fetch_without_maven_or_cache_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BMX_RERANK_M2_REPO", str(tmp_path / "m2"))
    monkeypatch.setattr(artifacts.shutil, "which", lambda _name: None)
    with pytest.raises(eng.EngineError, match=r"no Maven.*apt-get install maven"):
        artifacts.fetch_artifact(artifacts.distribution_artifact("opensearch", "2.19.3"), tmp_path / "cache")


def test_fetch_copies_from_m2_and_checks_sha1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BMX_RERANK_M2_REPO", str(tmp_path / "m2"))
    artifact = artifacts.OPENSEARCH_MODULES[0].jar("2.19.3")
    local = artifact.local_path(tmp_path / "m2")
    local.parent.mkdir(parents=True)
    local.write_bytes(b"jar bytes")
    Path(f"{local}.sha1").write_text("0" * 40)
    with pytest.raises(eng.EngineError, match="does not match its .sha1"):
        artifacts.fetch_artifact(artifact, tmp_path / "cache")
    Path(f"{local}.sha1").write_text(hashlib.sha1(b"jar bytes").hexdigest() + "  file\n")
    copied = artifacts.fetch_artifact(artifact, tmp_path / "cache")
    assert copied == tmp_path / "cache" / "analysis-common-2.19.3.jar"
    assert copied.read_bytes() == b"jar bytes" and copied.stat().st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------------------------
# Process handling with fake distributions (a shell/Python script instead of a JVM)
# --------------------------------------------------------------------------------------------

FAKE_SERVER = """\
import http.server, json, os, re, sys
conf = os.environ["OPENSEARCH_PATH_CONF"]
yml = open(os.path.join(conf, "opensearch.yml")).read()
port = int(re.search(r'http.port: "(\\d+)"', yml).group(1))
CLUSTER = CLUSTER or re.search(r'cluster.name: "([^"]+)"', yml).group(1)
seeds = re.search(r'discovery.seed_hosts: (\\[.*\\])', yml)
NODES = len(json.loads(seeds.group(1))) if seeds else 1  # a member answers as if all had joined
json.dump(dict(os.environ), open(os.path.join(os.environ["HOME"], "env.json"), "w"))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"cluster_name": CLUSTER, "status": "green", "number_of_nodes": NODES}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
print("fake engine listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake OpenSearch 2.19.3 in a private cache/state, run as the current user."""
    monkeypatch.setenv("BMX_RERANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BMX_RERANK_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(host, "is_root", lambda: False)
    home = tmp_path / "cache" / "dists" / "opensearch-2.19.3"
    (home / "bin").mkdir(parents=True)
    (home / "config").mkdir()
    (home / "config" / "jvm.options").write_text(OS_219_JVM)
    (home / "config" / "opensearch.yml").write_text("# comments only\n")
    for module in artifacts.OPENSEARCH_MODULES:  # as installed once: nothing to fetch
        (home / "modules" / module.name).mkdir(parents=True)
        (home / "modules" / module.name / "plugin-descriptor.properties").write_text(f"name={module.name}\n")
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("")
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')

    def install(script: str, timeout: float = 20.0) -> eng.StartRequest:
        launcher = home / "bin" / "opensearch"
        launcher.write_text("#!/bin/sh\n" + script)
        launcher.chmod(0o755)
        return eng.StartRequest("opensearch", "2.19.3", free_port(), java_home=jdk, timeout=timeout)

    return install


def _group_gone(pgid: int) -> bool:
    for _ in range(50):
        if not process.group_alive(pgid):
            return True
        time.sleep(0.1)
    return False


def _server_script(tmp_path: Path, cluster: str | None) -> str:
    """A fake engine answering as `cluster` (None: the one its config names)."""
    path = tmp_path / "server.py"
    path.write_text(f"CLUSTER = {cluster!r}\n" + FAKE_SERVER)
    return f'exec "{sys.executable}" "{path}"\n'


def test_start_status_stop_and_idempotent_start(fake, tmp_path: Path) -> None:
    req = fake(_server_script(tmp_path, "bmx-rerank-opensearch"))
    state = eng.start(req)
    try:
        assert state.url == f"http://127.0.0.1:{req.port}"
        assert eng.start(req).pid == state.pid  # already running: same process, no second start
        st = eng.status("opensearch")
        assert st.running and st.health == "green" and st.state is not None and st.state.url == state.url

        node = Path(state.node_dir)
        env = json.loads((node / "env.json").read_text())
        assert env["OPENSEARCH_JAVA_HOME"] == str(tmp_path / "jdk")
        assert env["OPENSEARCH_JAVA_OPTS"] == "-Xms512m -Xmx512m"
        assert env["OPENSEARCH_PATH_CONF"] == str(node / "config")
        assert (
            "-XX:ErrorFile=" + str(node / "logs" / "hs_err_pid%p.log")
            in (node / "config/jvm.options").read_text()
        )
        assert 'discovery.type: "single-node"' in (node / "config/opensearch.yml").read_text()
        assert "fake engine listening" in (node / "logs" / "console.log").read_text()
    finally:
        assert eng.stop("opensearch") is True
    assert _group_gone(state.pid)
    assert not eng.status("opensearch").running
    assert eng.stop("opensearch") is False


def test_engine_exiting_during_start_shows_its_log(fake) -> None:
    req = fake("echo 'fatal error: unknown setting [plugins.security.disabled]'\nexit 3\n")
    with pytest.raises(eng.EngineError, match=r"(?s)exited with code 3.*unknown setting \[plugins"):
        eng.start(req)
    assert process.load_state("opensearch") is None


def test_start_timeout_kills_the_whole_process_group(fake, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    req = fake(f"sleep 300 &\necho $! > {pidfile}\nwait\n", timeout=1.0)
    with pytest.raises(eng.EngineError, match=r"did not become ready within 1s"):
        eng.start(req)
    child = int(pidfile.read_text())
    for _ in range(50):  # the grandchild (same process group) must die too; init reaps it
        if process.proc_start_ticks(child) is None:
            break
        time.sleep(0.1)
    assert process.proc_start_ticks(child) is None


def test_another_cluster_on_the_port_is_not_taken_for_ours(fake, tmp_path: Path) -> None:
    req = fake(_server_script(tmp_path, "someone-else"))
    with pytest.raises(eng.EngineError, match="another engine grabbed port"):
        eng.start(req)


def test_port_taken_fails_before_starting(fake) -> None:
    req = fake("echo started > /dev/stderr\nexit 1\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", req.port))
        sock.listen()
        with pytest.raises(eng.EngineError, match=rf"port {req.port} on 127.0.0.1 is already in use.*--port"):
            eng.start(req)


def test_cli_prints_errors_without_traceback(fake, tmp_path: Path) -> None:
    req = fake("exit 0\n")
    args = ["--version", "3.6.0", "--port", str(req.port), "--java-home", str(tmp_path / "jdk")]
    result = CliRunner().invoke(main, ["engine", "start", "opensearch", *args])
    assert result.exit_code == 1
    assert "error: opensearch 3.6.0 needs Java 21 or newer" in result.output
    assert "Traceback" not in result.output
    status = CliRunner().invoke(main, ["engine", "status", "opensearch"])
    assert status.exit_code == 1 and "opensearch: not running" in status.output


def test_cli_start_prints_the_url_last(fake, tmp_path: Path) -> None:
    req = fake(_server_script(tmp_path, "bmx-rerank-opensearch"))
    runner = CliRunner()
    try:
        result = runner.invoke(
            main,
            ["engine", "start", "opensearch", "--port", str(req.port), "--java-home", str(tmp_path / "jdk")],
        )
        assert result.exit_code == 0, result.output
        assert result.output.strip().splitlines()[-1] == f"http://127.0.0.1:{req.port}"
    finally:
        stopped = runner.invoke(main, ["engine", "stop", "opensearch"])
    assert "opensearch: stopped" in stopped.output


def test_an_engine_whose_state_cannot_be_saved_is_stopped_not_orphaned(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its state file `stop` could not find the engine: start must not leave it running."""
    req = fake(_server_script(tmp_path, "bmx-rerank-opensearch"))
    pids: list[int] = []
    real_popen = eng.subprocess.Popen

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        pids.append(proc.pid)
        return proc

    def no_space(_state: eng.EngineState) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(eng.subprocess, "Popen", popen)
    monkeypatch.setattr(eng, "save_state", no_space)
    with pytest.raises(eng.EngineError, match="could not record the engine's state.*No space left"):
        eng.start(req)
    assert len(pids) == 1 and _group_gone(pids[0])
    assert process.load_state("opensearch") is None


@pytest.mark.parametrize("args", [["start", "opensearch"], ["stop"]])
def test_cli_reports_an_unusable_state_directory_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str]
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("BMX_RERANK_STATE", str(not_a_dir / "state"))
    result = CliRunner().invoke(main, ["engine", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("error: [Errno 20] Not a directory")


# --------------------------------------------------------------------------------------------
# A local cluster of several nodes (bmx_rerank/testing/cluster.py), with fake distributions
# --------------------------------------------------------------------------------------------


def test_member_settings_form_one_cluster_without_single_node_discovery() -> None:
    seeds, masters = ["127.0.0.1:9300", "127.0.0.1:9301"], ["n0"]
    es = node_config.member_settings("elasticsearch", "c", "n1", 9201, 9301, Path("/n1"), seeds, masters)
    assert "discovery.type" not in es
    assert es["discovery.seed_hosts"] == seeds and es["cluster.initial_master_nodes"] == masters
    assert es["node.roles"] == ["data"], "a node not named to bootstrap is data-only"
    assert (es["cluster.name"], es["node.name"], es["transport.port"], es["http.port"]) == (
        "c",
        "n1",
        "9301",
        "9201",
    )
    assert es["path.data"] == "/n1/data" and es["xpack.security.enabled"] == "false"
    os_ = node_config.member_settings("opensearch", "c", "n0", 9200, 9300, Path("/n0"), seeds, masters)
    assert os_["cluster.initial_cluster_manager_nodes"] == masters
    assert os_["node.roles"] == ["cluster_manager", "data"]
    assert node_config.render_yaml({"r": ["a", "b"]}) == 'r: ["a", "b"]\n'


def test_a_local_cluster_starts_kills_a_node_and_leaves_nothing(fake, tmp_path: Path) -> None:
    req = fake(_server_script(tmp_path, None))
    cluster_req = local.ClusterRequest("opensearch", "2.19.3", nodes=2, java_home=req.java_home, timeout=20)
    with local.local_cluster(cluster_req) as cluster:
        root = cluster.root
        assert len(set(cluster.urls)) == 2 and all(m.alive() for m in cluster.members)
        first, second = cluster.members
        assert first.master_eligible and not second.master_eligible
        yml = (second.node_dir / "config" / "opensearch.yml").read_text()
        assert f'"127.0.0.1:{first.transport_port}"' in yml and f'"127.0.0.1:{second.transport_port}"' in yml
        assert (
            json.loads((second.node_dir / "env.json").read_text())["OPENSEARCH_JAVA_OPTS"]
            == local.CLUSTER_HEAP
        )
        second.kill()
        assert not second.alive() and first.alive()
    assert not root.exists()
    assert _group_gone(first.proc.pid)


def test_a_member_that_dies_during_start_stops_the_others_and_leaves_nothing(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "member.sh"
    script.write_text(  # the second member dies at once, the first would serve
        'grep -q "node.name: \\".*-1\\"" "$OPENSEARCH_PATH_CONF/opensearch.yml" && { echo "bind failed"; exit 7; }\n'
        + _server_script(tmp_path, None)
    )
    req = fake(f'. "{script}"\n')
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(*args, **kwargs):
        spawned.append(process.spawn(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(local, "spawn", spawn)
    cluster_req = local.ClusterRequest("opensearch", "2.19.3", java_home=req.java_home, timeout=20)
    with pytest.raises(eng.EngineError, match=r"(?s)-1 exited with code 7.*bind failed"):
        local.start_cluster(cluster_req)
    assert len(spawned) == 2 and all(_group_gone(p.pid) for p in spawned)
    assert [p for p in local.clusters_dir().iterdir() if p.is_dir()] == [], "no node directory left behind"


def test_a_cluster_whose_owner_died_is_removed_by_the_next_start(fake, tmp_path: Path) -> None:
    orphan = subprocess.Popen(["sleep", "300"], start_new_session=True)
    owner = subprocess.Popen(["true"])
    owner.wait()
    root = local.clusters_dir() / "bmx-rerank-opensearch-dead"
    root.mkdir(parents=True)
    members = [{"pid": orphan.pid, "ticks": process.proc_start_ticks(orphan.pid)}]
    record = {"owner": {"pid": owner.pid, "ticks": 1}, "members": members}
    (root / local.MEMBERS_FILE).write_text(json.dumps(record))
    req = fake(_server_script(tmp_path, None))
    with local.local_cluster(
        local.ClusterRequest("opensearch", "2.19.3", java_home=req.java_home, timeout=20)
    ):
        assert not root.exists()
        assert _group_gone(orphan.pid), "its node was stopped"
