"""What several commands read the same way: `--header 'Name: value'` options."""

from __future__ import annotations

from collections.abc import Iterable

import click


def parse_headers(values: Iterable[str]) -> dict[str, str]:
    """`--header` values as a header map; one value may hold several lines (a file's worth)."""
    headers: dict[str, str] = {}
    for raw in values:
        for line in raw.splitlines():
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise click.BadParameter(f"expected 'Name: value', got {line!r}", param_hint="--header")
            headers[name.strip()] = value.strip()
    return headers
