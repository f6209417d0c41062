"""The stats CLI's error path against a fake cluster: one line, non-zero exit, no secrets, no trace."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from bmx_rerank.cli.stats import command, connection

SEEN: list[str] = []


class Forbidden(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        SEEN.append(self.headers.get("Authorization", ""))
        body = json.dumps(
            {
                "error": {
                    "type": "security_exception",
                    "reason": "action [indices:data/read/field_caps] is unauthorized",
                },
                "status": 403,
            }
        ).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def forbidden_url() -> Iterator[str]:
    yield from _serve(Forbidden)


@pytest.mark.parametrize("sub", ["build", "show", "refresh"])
def test_a_403_is_one_line_with_exit_1_and_credentials_stay_secret(forbidden_url, sub):
    SEEN.clear()
    args = [
        sub,
        "idx",
        "--field",
        "body",
        "--upstream",
        forbidden_url,
        "--user",
        "bob",
        "--password",
        "s3cret!",
    ]
    result = CliRunner().invoke(command, args + (["--no-progress"] if sub != "show" else []))
    assert result.exit_code == 1
    assert (
        result.output
        == "error: [403] security_exception: action [indices:data/read/field_caps] is unauthorized\n"
    )
    assert "s3cret" not in result.output and "Traceback" not in result.output
    assert SEEN and all(h == "Basic Ym9iOnMzY3JldCE=" for h in SEEN)  # forwarded as Authorization


def test_connection_takes_credentials_from_url_user_or_headers():
    base, headers = connection("https://u:p@host:9200/", None, None, ())
    assert base == "https://host:9200" and headers == {"Authorization": "Basic dTpw"}
    base, headers = connection("http://h:9200", None, None, ("Authorization: ApiKey abc", "X-Opaque-Id: 7"))
    assert headers == {"Authorization": "ApiKey abc", "X-Opaque-Id": "7"}


@pytest.mark.parametrize("option", ["--batch-size", "--concurrency"])
def test_a_zero_batch_or_concurrency_is_refused_not_read_as_an_empty_index(option):
    """Zero made the id pages empty, so the sweep reported `bmx_empty_corpus_exception`."""
    args = ["build", "idx", "--field", "body", "--upstream", "http://127.0.0.1:1", option, "0"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2 and option in result.output and "x>=1" in result.output


class NotACluster(BaseHTTPRequestHandler):
    """A web server mistaken for the cluster: HTML pages, a 404 for paths with `missing`, else 200."""

    def do_GET(self) -> None:
        ok = "missing" not in self.path
        body = b"<html>\n<body>\n<h1>It works</h1>\n</body>\n</html>\n"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def not_a_cluster_url() -> Iterator[str]:
    yield from _serve(NotACluster)


@pytest.mark.parametrize(
    ("index", "start"),
    [("idx", "error: [502] bmx_upstream_unreachable_exception: "), ("missing", "error: [404] ")],
)
def test_an_upstream_that_is_not_a_cluster_is_one_line_too(not_a_cluster_url, index, start):
    """HTML with a 200 (not JSON) and HTML with a 404 (a multi-line reason): one line each."""
    result = CliRunner().invoke(command, ["show", index, "--field", "body", "--upstream", not_a_cluster_url])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith(start) and result.output.count("\n") == 1


def test_basic_credentials_are_utf8_and_a_colon_in_the_user_is_a_usage_error():
    import base64

    _, headers = connection("http://127.0.0.1:1", "élan", "pä:ss", ())
    assert headers["Authorization"] == "Basic " + base64.b64encode("élan:pä:ss".encode()).decode()
    args = ["show", "idx", "--field", "f", "--user", "a:b", "--upstream", "http://127.0.0.1:1"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2 and "not allowed in login" in result.output
    assert "Traceback" not in result.output
