"""The `bmx-rerank` command: one click group, one sub-module per surface."""

from __future__ import annotations

import importlib

import click


@click.group()
@click.version_option(package_name="bmx-rerank")
def main() -> None:
    """Rerank Elasticsearch/OpenSearch results with BMX."""


# Each surface lives in its own module and exposes a click command or group named `command`.
for _name in ("engine", "stats", "serve", "demo"):
    try:
        _module = importlib.import_module(f"bmx_rerank.cli.{_name}")
    except ModuleNotFoundError as exc:  # surface not built yet
        if exc.name != f"bmx_rerank.cli.{_name}":
            raise
        continue
    main.add_command(_module.command)
