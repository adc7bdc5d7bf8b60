"""Log lines (models/logs.py): the job's context appended, one JSON object per line on request,
and an exception shown as its classes and frames, never its message."""

from __future__ import annotations

import json
import logging
import sys

from spacejobs.models.logs import ContextFormatter

SECRET = 'invalid input syntax for type uuid: "a member\'s text"'


def record(message: str = "claimed %d jobs", *args: object, exc: bool = False,
           **context: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError(SECRET)
        except ValueError:
            exc_info = sys.exc_info()
    made = logging.LogRecord("spacejobs.worker", logging.INFO, __file__, 1, message,
                             args or ((3,) if "%" in message else ()),
                             exc_info)
    for key, value in context.items():
        setattr(made, key, value)
    return made


def test_a_line_carries_the_jobs_context_in_a_fixed_order_and_skips_the_unknown():
    line = ContextFormatter().format(record(attempt=2, job_id="j-1", kind="projects_export",
                                            request_id=None, params={"secret": 1}))
    assert line.endswith(f"INFO spacejobs.worker[{record().process}] claimed 3 jobs job_id=j-1 "
                         "kind=projects_export attempt=2")
    assert "secret" not in line and "request_id" not in line


def test_a_line_without_context_is_just_the_message():
    assert ContextFormatter().format(record()).endswith("claimed 3 jobs")


def test_json_lines_are_one_object_each_with_the_context_as_fields():
    payload = json.loads(ContextFormatter(as_json=True).format(record(job_id="j-1", attempt=1)))
    assert {k: payload[k] for k in ("level", "logger", "message", "job_id", "attempt")} == {
        "level": "INFO", "logger": "spacejobs.worker", "message": "claimed 3 jobs",
        "job_id": "j-1", "attempt": 1}
    assert "exception" not in payload


def test_an_exception_is_its_class_and_frames_and_never_its_message():
    for formatter in (ContextFormatter(), ContextFormatter(as_json=True)):
        text = formatter.format(record("failed", exc=True))
        assert "builtins.ValueError (message withheld)" in text
        assert "a member" not in text and "invalid input syntax" not in text
        assert "test_log_lines.py" in text  # where it was raised


def test_a_message_another_handler_cached_is_not_reused():
    made = record("failed", exc=True)
    made.exc_text = "ValueError: " + SECRET  # what logging.Formatter would have cached
    assert "a member" not in ContextFormatter().format(made)
