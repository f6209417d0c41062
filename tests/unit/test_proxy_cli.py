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


@pytest.fixture
def served(monkeypatch):
    """What `serve` would run: the app's state and web.run_app's arguments, without serving."""
    from bmx_rerank.cli import serve as serve_module
    from bmx_rerank.proxy import STATE

    seen: dict = {}

    def fake_run_app(app, **kwargs):
        seen.update(state=app[STATE], **kwargs)

    monkeypatch.setattr(serve_module.web, "run_app", fake_run_app)
    for name in list(__import__("os").environ):
        if name.startswith("BMX_RERANK_"):
            monkeypatch.delenv(name)
    return seen


def test_upstream_nodes_repeated_comma_and_from_the_environment(served, monkeypatch):
    args = ["serve", "--upstream", "http://a:9200", "--upstream", "http://b:9200,http://c:9200"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert served["state"]["nodes"] == ("http://a:9200", "http://b:9200", "http://c:9200")
    monkeypatch.setenv("BMX_RERANK_UPSTREAM", "http://d:9200 http://e:9200,http://f:9200")
    monkeypatch.setenv("BMX_RERANK_LISTEN", "0.0.0.0:9555")
    monkeypatch.setenv("BMX_RERANK_TIMEOUT", "7.5")
    assert CliRunner().invoke(main, ["serve"]).exit_code == 0
    assert served["state"]["nodes"] == ("http://d:9200", "http://e:9200", "http://f:9200")
    assert (served["host"], served["port"], served["state"]["config"].timeout) == ("0.0.0.0", 9555, 7.5)
    assert served["ssl_context"] is None


@pytest.mark.parametrize("kind", ["toml", "yaml"])
def test_config_file_under_environment_under_command_line(served, monkeypatch, tmp_path, kind):
    if kind == "toml":
        text = 'upstream = ["http://a:9200", "http://b:9200"]\nlisten = "127.0.0.1:9501"\n'
        text += 'timeout = 3.0\npolicy = "docs=body"\nstats-index = "my-stats"\nupstream-verify = false\n'
    else:
        text = "upstream: [http://a:9200, http://b:9200]\nlisten: 127.0.0.1:9501\ntimeout: 3.0\n"
        text += "policy: docs=body\nstats_index: my-stats\nupstream_verify: false\n"
    path = tmp_path / f"serve.{kind}"
    path.write_text(text)
    assert CliRunner().invoke(main, ["serve", "--config", str(path)]).exit_code == 0
    config = served["state"]["config"]
    assert served["state"]["nodes"] == ("http://a:9200", "http://b:9200")
    assert (served["port"], config.timeout, config.upstream_verify) == (9501, 3.0, False)
    assert [r.pattern for r in config.policies] == ["docs"]
    monkeypatch.setenv("BMX_RERANK_TIMEOUT", "4.0")
    result = CliRunner().invoke(main, ["serve", "--config", str(path), "--listen", "127.0.0.1:9502"])
    assert result.exit_code == 0
    assert (served["port"], served["state"]["config"].timeout) == (9502, 4.0)


def test_stats_index_reaches_the_statistics_cache(served, monkeypatch):
    from bmx_rerank.cli import serve as serve_module

    made = {}
    real = serve_module.statistics_source

    def spy(interval, store="bmx-stats"):
        made["store"] = store
        return real(interval, store)

    monkeypatch.setattr(serve_module, "statistics_source", spy)
    args = ["serve", "--upstream", "http://a:9200", "--stats-index", "team-stats"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert made["store"] == "team-stats"


def test_bad_config_and_tls_options_are_usage_errors(served, tmp_path):
    unknown = tmp_path / "x.toml"
    unknown.write_text('upstream = "http://a:9200"\nlisten_on = "x"\n')
    result = CliRunner().invoke(main, ["serve", "--config", str(unknown)])
    assert result.exit_code == 2 and "listen_on" in result.output
    broken = tmp_path / "y.yaml"
    broken.write_text("upstream: [unclosed\n")
    assert CliRunner().invoke(main, ["serve", "--config", str(broken)]).exit_code == 2
    not_pem = tmp_path / "cert.pem"
    not_pem.write_text("not a certificate")
    for args in (
        ["--tls-cert", str(not_pem)],
        ["--tls-key", str(not_pem)],
        ["--upstream-ca", str(not_pem)],
        ["--upstream-key", str(not_pem)],
    ):
        result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200", *args])
        assert result.exit_code == 2, (args, result.output)
    assert "credentials" in CliRunner().invoke(main, ["serve", "--upstream", "http://u:p@a:9200"]).output
