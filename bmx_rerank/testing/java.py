"""Java discovery: which JDK an engine version needs, and finding one on this machine."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bmx_rerank.testing.kinds import EngineError, EngineKind, parse_version


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


def java_candidates(java_home: Path | None) -> list[JavaHome]:
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
