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
    """What `serve` would run: the app's state and serve_forever's arguments, without serving."""
    from bmx_rerank.cli import serve as serve_module

    seen: dict = {}

    def fake_serve(app, host, port, ssl_context=None, reuse_port=False, limits=None):
        seen.update(
            state=app.state,
            host=host,
            port=port,
            ssl_context=ssl_context,
            reuse_port=reuse_port,
            limits=limits,
        )

    monkeypatch.setattr(serve_module, "serve_forever", fake_serve)
    for name in list(__import__("os").environ):
        if name.startswith("BMX_RERANK_"):
            monkeypatch.delenv(name)
    return seen


def test_upstream_nodes_repeated_comma_and_from_the_environment(served, monkeypatch):
    args = ["serve", "--upstream", "http://a:9200", "--upstream", "http://b:9200,http://c:9200"]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert served["state"].nodes == ("http://a:9200", "http://b:9200", "http://c:9200")
    monkeypatch.setenv("BMX_RERANK_UPSTREAM", "http://d:9200 http://e:9200,http://f:9200")
    monkeypatch.setenv("BMX_RERANK_LISTEN", "0.0.0.0:9555")
    monkeypatch.setenv("BMX_RERANK_TIMEOUT", "7.5")
    assert CliRunner().invoke(main, ["serve"]).exit_code == 0
    assert served["state"].nodes == ("http://d:9200", "http://e:9200", "http://f:9200")
    assert (served["host"], served["port"], served["state"].config.timeout) == ("0.0.0.0", 9555, 7.5)
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
    config = served["state"].config
    assert served["state"].nodes == ("http://a:9200", "http://b:9200")
    assert (served["port"], config.timeout, config.upstream_verify) == (9501, 3.0, False)
    assert [r.pattern for r in config.policies] == ["docs"]
    monkeypatch.setenv("BMX_RERANK_TIMEOUT", "4.0")
    result = CliRunner().invoke(main, ["serve", "--config", str(path), "--listen", "127.0.0.1:9502"])
    assert result.exit_code == 0
    assert (served["port"], served["state"].config.timeout) == (9502, 4.0)


def test_stats_index_reaches_the_statistics_cache(served, monkeypatch):
    from bmx_rerank.cli import serve as serve_module

    made = {}
    real = serve_module.statistics_source

    def spy(interval, store="bmx-stats", *args):
        made["store"] = store
        return real(interval, store, *args)

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


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--log-level", "foo"], "--log-level"),
        (["--listen", "127.0.0.1:65536"], "[1, 65535]"),
        (["--listen", "127.0.0.1:0"], "[1, 65535]"),
        (["--listen", "nohost"], "HOST:PORT"),
        (["--upstream", "ftp://127.0.0.1:21"], "http:// or https:// node URL"),
        (["--upstream", "http://"], "http:// or https://"),
        (["--upstream", "http://127.0.0.1:99999"], "Port out of range"),
        (["--upstream", "http://u:p@127.0.0.1:9200"], "credentials"),
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--connect-timeout", "-5"], "--connect-timeout"),
        (["--stats-check-interval", "-1"], "--stats-check-interval"),
        (["--cache-bytes", "lots"], "--cache-bytes"),
        (["--max-body", "0"], "--max-body"),
        (["--max-window", "10001"], "--max-window"),
        (["--max-augment", "-1"], "--max-augment"),
        (["--max-msearch", "0"], "--max-msearch"),
        (["--max-concurrent-reranks", "0"], "--max-concurrent-reranks"),
        (["--on-overload", "drop"], "--on-overload"),
        (["--policy", "x=body,window_size=500", "--max-window", "100"], "--max-window"),
    ],
)
def test_every_bad_value_is_a_one_line_usage_error(args, needle):
    base = ["serve", "--upstream", "http://127.0.0.1:9200"]
    result = CliRunner().invoke(main, base + args)
    assert result.exit_code == 2, result.output
    assert (
        "Traceback" not in result.output
        and result.exception is None
        or isinstance(result.exception, SystemExit)
    )
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1 and needle in result.output, result.output


def test_sizes_take_units():
    from bmx_rerank.cli.serve import ByteSize

    size = ByteSize()
    assert size.convert("64MiB", None, None) == 64 << 20
    assert size.convert("1GB", None, None) == 10**9 and size.convert("512", None, None) == 512


def test_a_port_in_use_is_a_one_line_error():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = CliRunner().invoke(
            main, ["serve", "--upstream", "http://127.0.0.1:9200", "--listen", f"127.0.0.1:{port}"]
        )
    assert result.exit_code == 1 and "cannot serve on" in result.output and "Traceback" not in result.output


def test_tf_probes_auto_by_default_on_off_and_the_old_flags(served, monkeypatch, tmp_path):
    def mode(*args: str) -> str:
        result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200", *args])
        assert result.exit_code == 0, result.output
        return served["state"].config.tf_probes

    assert mode() == "auto"
    assert mode("--tf-probes") == "on", "the old flag alone"
    assert mode("--no-tf-probes") == "off"
    assert [mode("--tf-probes", m) for m in ("auto", "on", "off", "OFF")] == ["auto", "on", "off", "off"]
    path = tmp_path / "serve.toml"
    path.write_text("tf-probes = false\n")
    assert mode("--config", str(path)) == "off"
    monkeypatch.setenv("BMX_RERANK_TF_PROBES", "on")
    assert mode("--config", str(path)) == "on", "the environment over the file"
    result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200", "--tf-probes", "sometimes"])
    assert result.exit_code == 2 and "auto, on or off" in result.output


def test_the_command_and_the_proxy_import_without_the_eval_extras():
    """The image installs the runtime dependencies only: `bmx-rerank` (every subcommand) and the proxy
    must import without scipy, ir-measures or matplotlib (the `eval` extra), which `eval` loads lazily."""
    import subprocess
    import sys

    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('scipy', 'ir_measures', 'matplotlib'):\n"
        "            raise ImportError('not installed: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import bmx_rerank.cli, bmx_rerank.proxy, bmx_rerank.client\n"
        "from bmx_rerank.cli import main\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_the_guard_deadline_memory_and_connection_flags(served, monkeypatch):
    from bmx_rerank import defaults
    from bmx_rerank.proxy.server import ConnectionLimits

    result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200"])
    assert result.exit_code == 0, result.output
    config = served["state"].config
    assert (config.deadline, config.max_in_flight) == (defaults.DEADLINE, defaults.MAX_IN_FLIGHT)
    assert (config.max_depth, config.max_query_depth, config.max_content_length) == (100, 30, 100 << 20)
    assert served["limits"] == ConnectionLimits(defaults.IDLE_TIMEOUT, defaults.HEADER_TIMEOUT, None)
    monkeypatch.setenv("BMX_RERANK_DEADLINE", "2.5")
    args = ["--max-depth", "50", "--max-query-depth", "0", "--max-content-length", "10MiB"]
    args += [
        "--max-in-flight",
        "1GiB",
        "--idle-timeout",
        "5",
        "--header-timeout",
        "2",
        "--max-connections",
        "900",
    ]
    result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200", *args])
    assert result.exit_code == 0, result.output
    config = served["state"].config
    assert (config.deadline, config.max_depth, config.max_query_depth) == (2.5, 50, 0)
    assert (config.max_content_length, config.max_in_flight) == (10 << 20, 1 << 30)
    assert served["limits"] == ConnectionLimits(5.0, 2.0, 900)
    result = CliRunner().invoke(main, ["serve", "--upstream", "http://a:9200", "--max-depth", "5000"])
    assert result.exit_code == 2
