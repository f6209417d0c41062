"""Maven artifacts: the integ-test-zip distributions and the OpenSearch module jars they lack, downloaded
from Maven Central with `mvn dependency:get` and unpacked once into the shared cache.

The integ-test-zip distributions are the only official builds reachable where the network allows
package registries and nothing else.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from bmx_rerank.testing import host
from bmx_rerank.testing.host import (
    cache_dir,
    check_traversable,
    locked,
    m2_repository,
    makedirs_0755,
)
from bmx_rerank.testing.kinds import EngineError, EngineKind, Reporter, parse_version, quiet


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


@dataclass(frozen=True)
class Module:
    """An OpenSearch module the integ zip leaves out, added back from its plain jar on Maven Central
    (`org.opensearch.plugin`) with the libraries its POM names and a descriptor we write: module
    bundles are not published to Maven."""

    name: str  # the module's directory and plugin name
    artifact: str  # its jar's artifact id
    package: str  # where its plugin class lives
    classes: tuple[str, ...]  # the plugin class; renamed between 2.x and 3.x, so found in the jar
    description: str
    permissions: tuple[str, ...] = ()  # RuntimePermissions its code needs under 2.x's SecurityManager

    def jar(self, version: str) -> Artifact:
        return Artifact("org.opensearch.plugin", self.artifact, version, "jar")

    def pom(self, version: str) -> Artifact:
        return Artifact("org.opensearch.plugin", self.artifact, version, "pom")


# What a test cluster lacks and every OpenSearch distribution has: `english` and the stemmers
# (analysis-common), scripts (lang-painless: `script_score`, term statistics in a script) and
# `token_count` (mapper-extras), so that in-engine scoring can be measured against a real engine.
OPENSEARCH_MODULES = (
    Module(
        "analysis-common",
        "analysis-common",
        "org.opensearch.analysis.common",
        ("CommonAnalysisModulePlugin", "CommonAnalysisPlugin"),
        'Adds "built in" analyzers to OpenSearch.',
    ),
    Module(
        "lang-painless",
        "lang-painless",
        "org.opensearch.painless",
        ("PainlessModulePlugin", "PainlessPlugin"),
        "An easy, safe and fast scripting language for OpenSearch",
        ("createClassLoader", "getClassLoader"),  # it generates and loads classes at run time
    ),
    Module(
        "mapper-extras",
        "mapper-extras-client",
        "org.opensearch.index.mapper",
        ("MapperExtrasModulePlugin", "MapperExtrasPlugin"),
        "Adds advanced field mappers",
    ),
)


def plugin_classname(jar_names: Sequence[str], module: Module) -> str:
    """The module's plugin class, read from its jar: the class was renamed between 2.x and 3.x."""
    for name in module.classes:
        if f"{module.package.replace('.', '/')}/{name}.class" in jar_names:
            return f"{module.package}.{name}"
    raise EngineError(f"{module.artifact} jar has neither {' nor '.join(module.classes)}")


def plugin_descriptor(version: str, classname: str, module: Module) -> str:
    """plugin-descriptor.properties for a module installed from its jar.

    `extended.plugins` is left out on purpose: analysis-common's official one names lang-painless,
    which only script-based token filters need, and a missing one is fatal. Unknown keys are fatal to
    OpenSearch too, so only the documented ones are written.
    """
    java_version = "11" if parse_version(version)[0] < 3 else "21"
    return (
        f"name={module.name}\n"
        f"description={module.description}\n"
        f"version={version}\n"
        f"opensearch.version={version}\n"
        f"java.version={java_version}\n"
        f"classname={classname}\n"
    )


def security_policy(module: Module) -> str:
    """plugin-security.policy granting what the module's code needs under 2.x's SecurityManager."""
    grants = "".join(f'  permission java.lang.RuntimePermission "{name}";\n' for name in module.permissions)
    return f"grant {{\n{grants}}};\n"


def pom_libraries(pom: str) -> list[Artifact]:
    """The jars a module's POM says it runs with (compile and runtime scope), as Maven coordinates."""

    def local(tag: str) -> str:
        return tag.rsplit("}", 1)[-1]  # Maven's POM namespace, whichever version

    found = []
    project = ElementTree.fromstring(pom)
    listed = (d for section in project if local(section.tag) == "dependencies" for d in section)
    for dep in listed:  # the project's own, not a dependencyManagement's
        fields = {local(child.tag): (child.text or "").strip() for child in dep}
        if fields.get("scope", "compile") in ("compile", "runtime") and fields.get("optional") != "true":
            found.append(Artifact(fields["groupId"], fields["artifactId"], fields["version"], "jar"))
    return found


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


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_artifact(artifact: Artifact, dest_dir: Path, report: Reporter = quiet) -> Path:
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
    makedirs_0755(dest_dir)
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


def install_module(home: Path, module: Module, version: str, cache: Path, report: Reporter = quiet) -> None:
    """Add `module` to the distribution at `home`: its jar and libraries, our descriptor and, on 2.x,
    its security policy. Written beside and renamed into place, so a half-written module never loads."""
    archives = cache / "archives"
    jar = fetch_artifact(module.jar(version), archives, report)
    pom = fetch_artifact(module.pom(version), archives, report).read_text()
    libraries = [fetch_artifact(a, archives, report) for a in pom_libraries(pom)]
    target = home / "modules" / module.name
    staging = home.parent / f".{home.name}-{module.name}.part{os.getpid()}"  # never half in modules/
    shutil.rmtree(staging, ignore_errors=True)
    makedirs_0755(staging)
    for path in (jar, *libraries):
        shutil.copyfile(path, staging / path.name)
    with zipfile.ZipFile(jar) as zf:
        classname = plugin_classname(zf.namelist(), module)
    (staging / "plugin-descriptor.properties").write_text(plugin_descriptor(version, classname, module))
    if module.permissions and parse_version(version)[0] < 3:
        (staging / "plugin-security.policy").write_text(security_policy(module))
    _make_world_readable(staging)
    makedirs_0755(target.parent)
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)


def missing_modules(kind: EngineKind, home: Path) -> list[Module]:
    """The modules we add that the unpacked distribution does not have yet (an older cache's)."""
    if kind != "opensearch":
        return []
    return [
        m
        for m in OPENSEARCH_MODULES
        if not (home / "modules" / m.name / "plugin-descriptor.properties").is_file()
    ]


def ensure_distribution(kind: EngineKind, version: str, report: Reporter = quiet) -> Path:
    """Return the unpacked distribution's home, downloading and unpacking it once into the cache."""
    cache = cache_dir()
    if host.is_root():
        makedirs_0755(cache)
        check_traversable(cache)
    home = cache / "dists" / f"{kind}-{version}"
    if (home / "bin" / kind).is_file() and not missing_modules(kind, home):
        return home
    with locked(cache / f".{kind}-{version}.lock"):
        if not (home / "bin" / kind).is_file():
            _unpack(kind, version, home, cache, report)
        for module in missing_modules(kind, home):  # all of them on a new home; an older cache's few
            install_module(home, module, version, cache, report)
    return home


def _unpack(kind: EngineKind, version: str, home: Path, cache: Path, report: Reporter) -> None:
    archive = fetch_artifact(distribution_artifact(kind, version), cache / "archives", report)
    report(f"unpacking {archive.name}")
    staging = cache / "dists" / f".{kind}-{version}.unpack{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    makedirs_0755(staging)
    _unzip(archive, staging)
    top = staging / f"{kind}-{version}"
    if not (top / "bin" / kind).is_file():
        raise EngineError(f"{archive} does not contain {kind}-{version}/bin/{kind}: delete it and retry")
    if parse_version(version)[0] >= 3 and kind == "opensearch" and not (top / "agent").is_dir():
        raise EngineError(f"{archive} has no agent/ directory, which OpenSearch 3.x needs to start")
    _make_world_readable(top)
    shutil.rmtree(home, ignore_errors=True)
    top.replace(home)
    shutil.rmtree(staging, ignore_errors=True)
