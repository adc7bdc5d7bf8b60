"""The OpenTelemetry SDK, set up once for a process that traces (models/tracing.py decides, and
imports this module only then: it needs the ``otel`` extra).

The SDK reads its own ``OTEL_*`` variables as the specification says (service name, resource
attributes, sampler, batch delays, the OTLP endpoint, headers and timeout); here we choose the
exporter, add database spans (psycopg's instrumentation, on each connection our engines open:
SQLAlchemy's does not support SQLAlchemy 2.1) and put :class:`SafeSpans` in front of the exporter.

:class:`SafeSpans` is the no-tenant-data rule at the door: whatever made a span (our code, the
Flask, Celery or psycopg instrumentation), only the attributes named in :data:`ALLOWED`
leave the process. An instrumentation's statement text (``db.statement``), full URL, query
string, client address or user agent, a status description and an exception's message or
stack trace are dropped; an exception keeps its class. Span names pass the same door
(:func:`safe_name`): an HTTP span is named by its method and route template alone (the method
alone when no route matched: the Flask instrumentation would name it from the raw path), a
database span by its statement's verb; Celery's spans (``run/<task>``, ``apply_async/<task>``)
and ours (``attempt <kind>``, ``spacejobs.step``) are named by registered names only.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status
from opentelemetry.util.types import Attributes

from spacejobs.models.settings import Settings

log = logging.getLogger("spacejobs.tracing")

#: the attributes that may leave the process: ours (``spacejobs.*``: ids, kinds, attempts,
#: statuses, outcomes) and those of the instrumentations that say what and where, never whose
ALLOWED = frozenset({
    # HTTP server spans (Flask): the route's template, never the URL with its values
    "http.method", "http.request.method", "http.route", "http.status_code",
    "http.response.status_code", "http.scheme", "url.scheme", "http.flavor",
    "network.protocol.version",
    # database client spans (psycopg): which database, never the statement
    "db.system", "db.system.name", "db.name", "db.namespace", "server.address", "server.port",
    "net.peer.name", "net.peer.port",
    # Celery's publish and run spans: the task's name and message id, the queue
    "celery.action", "celery.task_name", "celery.state", "messaging.system",
    "messaging.message.id", "messaging.destination", "messaging.destination.name",
    "messaging.destination_kind", "messaging.operation",
    # an exception event: its class only (models.tracing.record_exception)
    "exception.type",
})
OWN_PREFIX = "spacejobs."


def safe_attributes(attributes: Attributes) -> dict[str, Any]:
    """Only the attributes that may leave the process."""
    return {key: value for key, value in (attributes or {}).items()
            if key in ALLOWED or key.startswith(OWN_PREFIX)}


class SafeSpans(SpanProcessor):
    """Passes each finished span on with only :data:`ALLOWED` attributes (span, events and
    links), and without its status description."""

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner

    def on_start(self, span: Span, parent_context: otel_context.Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inner.on_end(safe_copy(span))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def safe_copy(span: ReadableSpan) -> ReadableSpan:
    """``span`` as it may leave the process."""
    events: Sequence[Event] = tuple(
        Event(event.name, safe_attributes(event.attributes), event.timestamp)
        for event in span.events)
    links = tuple(Link(link.context, safe_attributes(link.attributes)) for link in span.links)
    return ReadableSpan(
        name=safe_name(span), context=span.context, parent=span.parent, resource=span.resource,
        attributes=safe_attributes(span.attributes), events=events, links=links, kind=span.kind,
        status=Status(span.status.status_code), start_time=span.start_time,
        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


def safe_name(span: ReadableSpan) -> str:
    """``span``'s name as it may leave the process: never a value from a URL or a statement.

    An HTTP span (a server span, or any span with an HTTP method: the Flask instrumentation
    makes an INTERNAL one for a request inside a span of this process) is ``{method}
    {route}``, the route's template, or ``{method}`` alone when no route matched (an unknown
    path, a method the path does not take), for which the instrumentation took the raw path,
    values and all; a method the HTTP conventions do not know is ``HTTP``, as they say (a
    server span without a method attribute: its name's first word, if it is a method). A
    database span is its statement's verb (``SELECT``, ``UPDATE``, ``WITH``), read past the
    comments our statements start with (the instrumentation takes the first word, often
    ``--``), whichever conventions named the statement's attribute. Any other span keeps its
    name: Celery's are its task's (ours), the runner's the kind's (registered)."""
    attributes = span.attributes or {}
    method = attributes.get("http.request.method", attributes.get("http.method"))
    if method is not None or span.kind is SpanKind.SERVER:
        if method is None:  # a server span without the attribute: its name's first word
            method = span.name.split(" ", 1)[0]
        named = method if isinstance(method, str) and method in HTTP_METHODS else "HTTP"
        route = attributes.get("http.route")
        return f"{named} {route}" if isinstance(route, str) and route else named
    statement = attributes.get("db.statement", attributes.get("db.query.text"))
    if span.kind is not SpanKind.CLIENT or not isinstance(statement, str):
        return span.name
    verb = _VERB.match(_COMMENTS.sub(" ", statement))
    return verb[1].upper() if verb else "statement"


#: the methods an HTTP span is named by (the conventions' list, as the instrumentations
#: normalize them); any other is ``HTTP``
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE",
                          "PATCH", "QUERY"})

_COMMENTS = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)
_VERB = re.compile(r"\s*([A-Za-z]{1,20})\b")


class NoOrphanClientSpans(Sampler):
    """The sampler the ``OTEL_TRACES_SAMPLER`` variables chose, except that a database statement
    or a published message outside any trace (the heartbeat, an idle claim, the sweeper) starts
    no trace of its own: one trace per statement would bury the jobs' traces."""

    def __init__(self, inner: Sampler) -> None:
        self.inner = inner

    def should_sample(self, parent_context: otel_context.Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: trace.TraceState | None = None) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid and kind in (SpanKind.CLIENT, SpanKind.PRODUCER):
            return SamplingResult(Decision.DROP)
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links,
                                        trace_state)

    def get_description(self) -> str:
        return f"NoOrphanClientSpans{{{self.inner.get_description()}}}"


def exporters(settings: Settings) -> list[SpanExporter] | None:
    """The exporters ``OTEL_TRACES_EXPORTER`` names, comma-separated (unset: ``otlp``, as the
    specification says); None, with a warning, when one is not one we ship."""
    names = [n.strip().lower() for n in (settings.otel_traces_exporter or "otlp").split(",")]
    chosen: list[SpanExporter] = []
    for name in filter(None, names):
        if name == "otlp":
            protocol = (settings.otel_exporter_otlp_traces_protocol
                        or settings.otel_exporter_otlp_protocol or "http/protobuf").strip().lower()
            if protocol != "http/protobuf":
                log.warning("OTLP protocol %s is not the one we ship (http/protobuf): no traces",
                            protocol)
                return None
            # The exporter reads its endpoint, headers, timeout and compression from the
            # OTEL_EXPORTER_OTLP_* variables itself.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            chosen.append(OTLPSpanExporter())
        elif name == "console":
            chosen.append(ConsoleSpanExporter())
        else:
            log.warning("OTEL_TRACES_EXPORTER names %s, not one we ship (otlp, console): no traces",
                        name)
            return None
    return chosen or None


def install(settings: Settings, service_name: str) -> TracerProvider | None:
    """Install this process's tracer provider; None when an exporter asked for is not one we
    ship."""
    chosen = exporters(settings)
    if chosen is None:
        return None
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over our default name.
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    configured = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
    provider = TracerProvider(resource=resource, sampler=NoOrphanClientSpans(configured))
    for each in chosen:
        provider.add_span_processor(SafeSpans(BatchSpanProcessor(each)))
    trace.set_tracer_provider(provider)
    return provider


def instrument_connection(connection: psycopg.Connection[Any]) -> None:
    """Statement spans for one psycopg connection (models/db/engine.py: each one an engine
    opens), from the global provider installed above."""
    PsycopgInstrumentor.instrument_connection(connection)

