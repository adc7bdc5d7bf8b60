"""What leaves a tracing process: only listed attributes (ids, kinds, routes, verbs), never a
statement's text, a URL's values, a client's address or an exception's message, whichever
instrumentation put them on a span. Through the SDK's in-memory exporter."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode

from spacejobs.models import tracing
from spacejobs.models.trace_setup import NoOrphanClientSpans, SafeSpans

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


def test_a_span_named_from_a_url_without_a_route_leaves_with_the_method_alone() -> None:
    """What the Flask instrumentation names a request no route matched (a 404, a 405): the
    method and the raw path, values and all. It leaves as the method (``HTTP`` for one the
    instrumentation does not know), as the HTTP conventions name a request without a route; a
    matched route keeps its template, whatever kind of span the instrumentation made."""
    provider, exported = traced()
    tracer = provider.get_tracer("test")
    path = f"/api/v1/orgs/0b9c/ZXQ-{SECRET}-path"
    for name, kind, attributes in (
            (f"GET {path}", SpanKind.SERVER, {"http.method": "GET", "http.target": path}),
            # the new conventions' attribute; a request inside a span of this process: INTERNAL
            (f"PUT {path}", SpanKind.INTERNAL, {"http.request.method": "PUT"}),
            (path, SpanKind.SERVER, {"http.method": "_OTHER"}),
            (f"BREW {path}", SpanKind.SERVER, {}),
            (f"DELETE {path}", SpanKind.SERVER, {}),
            ("POST /api/v1/orgs/<org>/jobs", SpanKind.SERVER,
             {"http.method": "POST", "http.route": "/api/v1/orgs/<org>/jobs"})):
        with tracer.start_as_current_span(name, kind=kind, attributes=attributes):
            pass
    assert [span.name for span in exported.get_finished_spans()] == [
        "GET", "PUT", "HTTP", "HTTP", "DELETE", "POST /api/v1/orgs/<org>/jobs"]


def test_the_other_spans_keep_names_that_carry_no_value() -> None:
    """Celery's spans are named by the task (ours), the runner's by the kind (registered),
    a database span by its statement's verb, whichever convention put the statement on it."""
    provider, exported = traced()
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("run/spacejobs.wake", kind=SpanKind.CONSUMER,
                                      attributes={"celery.task_name": "spacejobs.wake"}):
        with tracer.start_as_current_span("apply_async/spacejobs.wake", kind=SpanKind.PRODUCER):
            pass
        with tracer.start_as_current_span("attempt test.kind", kind=SpanKind.CONSUMER):
            pass
        with tracer.start_as_current_span("--", kind=SpanKind.CLIENT, attributes={
                "db.system.name": "postgresql",
                "db.query.text": f"/* claim */ -- {SECRET}\nupdate jobs SET x = '{SECRET}'"}):
            pass
    assert [span.name for span in exported.get_finished_spans()] == [
        "apply_async/spacejobs.wake", "attempt test.kind", "UPDATE", "run/spacejobs.wake"]
