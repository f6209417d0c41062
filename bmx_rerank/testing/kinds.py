"""The engines the launcher knows: kinds, default versions and ports, version numbers, its error type."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

EngineKind = Literal["elasticsearch", "opensearch"]
KINDS: tuple[EngineKind, ...] = ("elasticsearch", "opensearch")

DEFAULT_VERSIONS: dict[str, str] = {"elasticsearch": "8.19.21", "opensearch": "2.19.3"}
DEFAULT_PORTS: dict[str, int] = {"elasticsearch": 9200, "opensearch": 9201}

Reporter = Callable[[str], None]


class EngineError(Exception):
    """A failure the user can act on; the message says what to do (the CLI prints it without a trace)."""


def quiet(_: str) -> None:
    """Default progress reporter: say nothing."""


def parse_version(version: str) -> tuple[int, int, int]:
    """Split "8.19.21" so that version rules (Java range, descriptor fields) can compare numbers."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version.strip())
    if not m:
        raise EngineError(f"version {version!r} is not of the form MAJOR.MINOR.PATCH (e.g. 8.19.21)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))
