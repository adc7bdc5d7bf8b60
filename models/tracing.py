"""Traces: a job row's trace context (W3C ``traceparent``), and whether this process traces.

A submit stores the trace context current at that moment (the web request's server span, or
whatever span the application's own code is in) on the job row; the worker parents each
attempt's span with it (tasks/tracing.py), so one trace runs from ``POST …/jobs`` to the end.

Off by default and free when off: nothing here makes a span object unless :func:`configure`
found the standard ``OTEL_*`` variables asking for traces and set the SDK up
(models/trace_setup.py, the ``otel`` extra). Reading the current trace context at a submit is
the API's no-op when no provider is installed (an invalid context, nothing stored).

What a span may carry is ids and kinds only (a job's id, kind, attempt, organization id, an
outcome or status): never params, results, error messages, user names, a signal's name or
payload. The export path enforces it as well (models/trace_setup.py keeps only listed
attributes and drops exception messages), so an instrumentation's statement text or URL
never leaves the process either.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import psycopg
from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.settings import Settings

log = logging.getLogger("spacejobs.tracing")

Connected = TypeVar("Connected", bound=psycopg.Connection[Any])

#: the one version of the W3C format we write and read (the column's CHECK says the same)
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

#: the tracer of this process once :func:`configure` set tracing up; None: tracing is off
_tracer: trace.Tracer | None = None
_configured = False


def format_traceparent(context: SpanContext) -> str | None:
    """``00-<trace id>-<span id>-<flags>`` of a valid span context, else None."""
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The remote span context a stored ``traceparent`` names; None when there is none, or it
    is not the version-00 format with non-zero ids."""
    found = TRACEPARENT.match(value or "")
    if found is None:
        return None
    context = SpanContext(trace_id=int(found[1], 16), span_id=int(found[2], 16), is_remote=True,
                          trace_flags=TraceFlags(int(found[3], 16)))
    return context if context.is_valid else None


def current_traceparent() -> str | None:
    """The trace context a submit stores: the current span's, whoever set tracing up (us or
    the application); None when no span is current (tracing off: the API's no-op)."""
    return format_traceparent(trace.get_current_span().get_span_context())


def wanted(settings: Settings) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces. Off by default: unlike the SDK's own
    default exporter (``otlp``), an unset ``OTEL_TRACES_EXPORTER`` means off unless an OTLP
    endpoint is set; ``OTEL_SDK_DISABLED=true`` and ``OTEL_TRACES_EXPORTER=none`` always win."""
    if settings.otel_sdk_disabled:
        return False
    exporter = (settings.otel_traces_exporter or "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(settings.otel_exporter_otlp_endpoint or settings.otel_exporter_otlp_traces_endpoint)


def configure(settings: Settings, service_name: str) -> bool:
    """Set traces up for this process once, when the ``OTEL_*`` variables ask for them
    (:func:`wanted`): the SDK's provider, its exporter and the database instrumentation.
    True when this process traces. A forked child keeps its parent's set-up (the SDK's
    exporter thread restarts in the child)."""
    global _tracer, _configured
    if _configured:
        return _tracer is not None
    _configured = True
    if not wanted(settings):
        return False
    try:
        from spacejobs.models import trace_setup
    except ImportError:
        log.warning("OTEL_* variables ask for traces, but the OpenTelemetry SDK is not installed "
                    "(pip install 'spacejobs[otel]'): no traces")
        return False
    provider = trace_setup.install(settings, service_name)
    if provider is None:
        return False
    _tracer = provider.get_tracer("spacejobs")
    return True


def tracer() -> trace.Tracer | None:
    """This process's tracer, None when tracing is off."""
    return _tracer


def instrument_connection(connection: Connected) -> Connected:
    """A database span per statement of this connection, when this process traces (the
    statement's text never leaves the process: models/trace_setup.py)."""
    if _tracer is not None:
        from spacejobs.models import trace_setup

        trace_setup.instrument_connection(connection)
    return connection


def record_exception(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc`` as the diagnostics do (models/diagnostics.py): its class
    and SQLSTATE, never its message, which may quote a tenant's data."""
    diagnosis = diagnose(exc)
    span.add_event("exception", {"exception.type": diagnosis.exception_class,
                                 "spacejobs.exception.summary": diagnosis.summary})


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, str | int | bool]) -> Iterator[None]:
    assert _tracer is not None
    # The SDK's own exception recording would put the message on the span: ours does not.
    with _tracer.start_as_current_span(name, attributes=attributes, record_exception=False,
                                       set_status_on_exception=False) as current:
        try:
            yield
        except BaseException as exc:
            record_exception(current, exc)
            raise


def span(name: str, attributes: Mapping[str, str | int | bool]) -> contextlib.AbstractContextManager[None]:
    """A child span of the current one around a block (ids and kinds only in ``attributes``);
    nothing at all when tracing is off."""
    if _tracer is None:
        return contextlib.nullcontext()
    return _span(name, attributes)
