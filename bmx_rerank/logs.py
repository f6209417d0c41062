"""JSON log lines (python-json-logger, serialized by orjson), for the proxy and the commands that run it."""

from __future__ import annotations

import logging
import time
from typing import Any

from pythonjsonlogger.orjson import OrjsonFormatter


class JsonLines(OrjsonFormatter):
    """One JSON object per line (python-json-logger): ts, level, logger, msg, the fields the code chose
    to log, and the stack trace (`exc_info`) of an exception. Never headers, bodies or userinfo: the
    proxy logs method, path, status, kind, timings and error classes only."""

    converter = time.gmtime

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger", "message": "msg"},
            datefmt="%Y-%m-%dT%H:%M:%SZ",
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


def serve_logs(level: str, stream: Any) -> None:
    """This process logs JSON lines to `stream` from `level` up, and its records skip what no line
    shows (the caller's frame, thread and process: the logging HOWTO's "Optimization"): the proxy
    writes one line a request."""
    logging.basicConfig(level=level.upper(), handlers=[json_log_handler(stream)], force=True)
    logging._srcfile = None  # type: ignore[attr-defined]  # no sys._getframe() walk per record
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
