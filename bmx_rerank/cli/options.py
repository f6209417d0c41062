"""What several commands read the same way: the cluster they reach (`--upstream`, credentials) and
`--header 'Name: value'` options."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import click

UPSTREAM_OPTIONS = (
    click.option(
        "--upstream",
        envvar="BMX_UPSTREAM",
        default="http://127.0.0.1:9200",
        show_default=True,
        help="Cluster base URL (env BMX_UPSTREAM).",
    ),
    click.option("--user", envvar="BMX_UPSTREAM_USER", help="Basic-auth user (env BMX_UPSTREAM_USER)."),
    click.option(
        "--password",
        envvar="BMX_UPSTREAM_PASSWORD",
        help="Basic-auth password (env BMX_UPSTREAM_PASSWORD).",
    ),
    click.option(
        "--header",
        "header",
        multiple=True,
        envvar="BMX_UPSTREAM_HEADER",
        help="Extra header 'Name: value', e.g. 'Authorization: ApiKey ...' (env BMX_UPSTREAM_HEADER).",
    ),
)


def upstream_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--upstream`, `--user`, `--password` and `--header`: the cluster a command's calls go to, and
    how they authenticate (`cli.stats.connection` reads them)."""
    for opt in reversed(UPSTREAM_OPTIONS):
        func = opt(func)
    return func


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
