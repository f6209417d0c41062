"""JSON log lines (python-json-logger, serialized by orjson), for the proxy and the commands that run it."""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from pythonjsonlogger.orjson import OrjsonFormatter

ACCESS_LOGGER = "bmx_rerank.proxy"  # the logger whose level says whether the line a request is written
TS_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # UTC to the second, as every line's `ts`


class JsonLines(OrjsonFormatter):
    """One JSON object per line (python-json-logger): ts, level, logger, msg, the fields the code chose
    to log, and the stack trace (`exc_info`) of an exception. Never headers, bodies or userinfo: the
    proxy logs method, path, status, kind, timings and error classes only."""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger", "message": "msg"},
            datefmt=TS_FORMAT,
        )

    def add_fields(self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict) -> None:
        super().add_fields(log_record, record, message_dict)
        fields = log_record.pop("fields", None)
        if isinstance(fields, dict):
            log_record.update(fields)
        log_record["level"] = record.levelname.lower()


def json_log_handler(stream: Any) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    return handler


class AccessLog:
    """The line the proxy writes for each request, with the keys of every other line (ts, level, logger,
    msg, then its fields). Where `serve_logs` set this process's logging up, it is written straight to
    that stream: through a `LogRecord` and python-json-logger's formatter the same line cost a quarter of
    a passthrough's own Python (benchmarks/RESULTS.md, "a passthrough's Python cut by a quarter").
    Elsewhere (a process with logging of its own: tests, an application serving the proxy itself) it
    goes through `logging` like any other line, to whatever handlers are there."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(ACCESS_LOGGER)
        self.stream: Any = None  # set by `serve_logs`: where its handler writes
        self._second = -1
        self._ts = ""

    def write(self, fields: dict[str, Any]) -> None:
        if not self.logger.isEnabledFor(logging.INFO):
            return
        stream = self.stream
        if stream is None:
            self.logger.info("request", extra={"fields": fields})
            return
        now = int(time.time())
        if now != self._second:  # one timestamp a second, as every line's `ts` has
            self._second, self._ts = now, time.strftime(TS_FORMAT, time.gmtime(now))
        line = {"ts": self._ts, "level": "info", "logger": ACCESS_LOGGER, "msg": "request", **fields}
        stream.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE).decode())
        stream.flush()


ACCESS = AccessLog()


def serve_logs(level: str, stream: Any) -> None:
    """This process logs JSON lines to `stream` from `level` up, and its records skip what no line
    shows (the caller's frame, thread and process: the logging HOWTO's "Optimization"); the line a
    request goes to `stream` by `ACCESS`."""
    logging.basicConfig(level=level.upper(), handlers=[json_log_handler(stream)], force=True)
    ACCESS.stream = stream
    logging._srcfile = None  # type: ignore[attr-defined]  # no sys._getframe() walk per record
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
