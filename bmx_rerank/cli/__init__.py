"""The `bmx-rerank` command: one click group, one sub-module per surface."""

from __future__ import annotations

import click

from bmx_rerank.cli import applied, demo, engine, eval, lengths, serve, stats


@click.group()
@click.version_option(package_name="bmx-rerank")
def main() -> None:
    """Rerank Elasticsearch/OpenSearch results with BMX."""


for _surface in (serve, stats, lengths, engine, demo, eval, applied):
    main.add_command(_surface.command)
