"""`bmx-rerank serve` option handling (the server itself is exercised in test_proxy.py)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from bmx_rerank.cli import main
from bmx_rerank.cli.serve import command, parse_listen


def test_serve_is_registered():
    assert main.commands["serve"] is command


def test_parse_listen():
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:9401") == ("::1", 9401)
    assert parse_listen(":9402") == ("127.0.0.1", 9402)
    with pytest.raises(click.BadParameter):
        parse_listen("localhost")


def test_bad_policy_is_a_usage_error():
    result = CliRunner().invoke(
        main, ["serve", "--upstream", "http://127.0.0.1:1", "--policy", "x=body,mode=nope"]
    )
    assert result.exit_code == 2
    assert "mode" in result.output


def test_missing_upstream_is_a_usage_error():
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 2 and "--upstream" in result.output
