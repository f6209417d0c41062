"""Maven artifacts: the integ-test-zip distributions and OpenSearch's analysis-common jar, downloaded
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


def analysis_common_artifact(version: str) -> Artifact:
    """OpenSearch's analysis-common module as a plain jar (the integ zip lacks `english` and stemmers)."""
    return Artifact("org.opensearch.plugin", "analysis-common", version, "jar")


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


def install_analysis_common(home: Path, version: str, cache: Path, report: Reporter = quiet) -> None:
    """Add OpenSearch's analysis-common jar as a module (jar + our descriptor) for `english` & co."""
    jar = fetch_artifact(analysis_common_artifact(version), cache / "archives", report)
    module = home / "modules" / "analysis-common"
    module.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(jar, module / jar.name)
    with zipfile.ZipFile(jar) as zf:
        classname = plugin_classname(zf.namelist())
    (module / "plugin-descriptor.properties").write_text(plugin_descriptor(version, classname))


def ensure_distribution(kind: EngineKind, version: str, report: Reporter = quiet) -> Path:
    """Return the unpacked distribution's home, downloading and unpacking it once into the cache."""
    cache = cache_dir()
    if host.is_root():
        makedirs_0755(cache)
        check_traversable(cache)
    home = cache / "dists" / f"{kind}-{version}"
    if (home / "bin" / kind).is_file():
        return home
    with locked(cache / f".{kind}-{version}.lock"):
        if (home / "bin" / kind).is_file():
            return home
        archive = fetch_artifact(distribution_artifact(kind, version), cache / "archives", report)
        report(f"unpacking {archive.name}")
        staging = cache / "dists" / f".{kind}-{version}.unpack{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        makedirs_0755(staging)
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
