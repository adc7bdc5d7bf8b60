"""What leaves a tracing process: only listed attributes (ids, kinds, routes, verbs), never a
statement's text, a URL's values, a client's address or an exception's message, whichever
instrumentation put them on a span. Through the SDK's in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from models import tracing
from models.trace_setup import NoOrphanClientSpans, SafeSpans

SECRET = "hunter2 tenant-note"


def traced() -> tuple[TracerProvider, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    provider = TracerProvider(sampler=NoOrphanClientSpans(ALWAYS_ON), shutdown_on_exit=False)
    provider.add_span_processor(SafeSpans(SimpleSpanProcessor(exported)))
    return provider, exported


def test_only_listed_attributes_leave_and_exceptions_keep_their_class_only() -> None:
    provider, exported = traced()
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("POST /api/v1/orgs/<org>/jobs", kind=SpanKind.SERVER,
                                      attributes={"http.route": "/api/v1/orgs/<org>/jobs",
                                                  "http.target": f"/api/v1/orgs/x?q={SECRET}",
                                                  "client.address": "10.0.0.7",
                                                  "user_agent.original": SECRET}) as server:
        with tracer.start_as_current_span("--", kind=SpanKind.CLIENT, attributes={
                "db.system": "postgresql", "db.statement": f"-- submit --\nSELECT '{SECRET}'"}):
            pass
        try:
            raise ValueError(SECRET)
        except ValueError as exc:
            server.record_exception(exc)  # what an instrumentation does: message and all
            tracing.record_exception(server, exc)
        server.set_status(StatusCode.ERROR, SECRET)
    spans = {span.name: span for span in exported.get_finished_spans()}
    assert set(spans) == {"POST /api/v1/orgs/<org>/jobs", "SELECT"}  # the verb, past the comment
    server_span = spans["POST /api/v1/orgs/<org>/jobs"]
    assert dict(server_span.attributes or {}) == {"http.route": "/api/v1/orgs/<org>/jobs"}
    assert dict(spans["SELECT"].attributes or {}) == {"db.system": "postgresql"}
    assert [dict(e.attributes or {}) for e in server_span.events] == [
        {"exception.type": "ValueError"},
        {"exception.type": "builtins.ValueError", "spacejobs.exception.summary": "builtins.ValueError"}]
    assert server_span.status.status_code is StatusCode.ERROR
    assert not server_span.status.description


def test_a_statement_outside_any_trace_starts_none() -> None:
    provider, exported = traced()
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT):  # the heartbeat's, say
        pass
    with tracer.start_as_current_span("attempt test.kind", kind=SpanKind.CONSUMER), \
            tracer.start_as_current_span("SELECT", kind=SpanKind.CLIENT):
        pass
    assert [span.name for span in exported.get_finished_spans()] == ["SELECT", "attempt test.kind"]
    assert exported.get_finished_spans()[0].parent is not None
