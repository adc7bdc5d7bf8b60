"""Logging for every process: one line per event, the job's context appended as key=value
(or one JSON object per line with SPACEJOBS_LOG_FORMAT=json). Never params, results or tokens,
and never an exception's message: a logged exception is its classes, SQLSTATEs and frames
(models/diagnostics.py), because a database error quotes the values it refused."""

from __future__ import annotations

import json
import logging
import sys
from types import TracebackType

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.settings import get_settings

CONTEXT_KEYS = ("request_id", "job_id", "kind", "organization_id", "attempt")


class ContextFormatter(logging.Formatter):
    def __init__(self, as_json: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
        self.as_json = as_json

    def formatException(
        self, ei: tuple[type[BaseException], BaseException, TracebackType | None]
        | tuple[None, None, None],
    ) -> str:
        exc = ei[1]
        return diagnose(exc).traceback.rstrip("\n") if exc is not None else ""

    def format(self, record: logging.LogRecord) -> str:
        # Another handler's formatter may have cached the usual text, message included.
        record.exc_text = None
        context = {k: getattr(record, k) for k in CONTEXT_KEYS if getattr(record, k, None) is not None}
        if self.as_json:
            payload = {"at": self.formatTime(record), "level": record.levelname, "logger": record.name,
                       "pid": record.process, "message": record.getMessage(), **context}
            if record.exc_info:
                payload["exception"] = self.formatException(record.exc_info)
            return json.dumps(payload, default=str)
        line = super().format(record)
        if context:
            line += " " + " ".join(f"{k}={v}" for k, v in context.items())
        return line


def configure_logging(level: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ContextFormatter(as_json=get_settings().log_format == "json"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level or get_settings().log_level)
