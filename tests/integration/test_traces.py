"""Traces, as an operator who sets the OTEL_* variables sees them: one trace from the request
that submits a job to its end, across a wait and a retry, exported over OTLP/HTTP by `spacejobs
web` and a Celery worker (real processes) to a collector this test runs; no tenant data in any
span. And with no OTEL_* variable, nothing is set up at all."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import requests
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import text

from spacejobs.models import tracing
from spacejobs.models.jobs.service import JobRequest
from spacejobs.models.settings import reload_settings
from spacejobs.tasks.engine.tracing import NO_SPANS
from spacejobs.tasks.worker_process import WorkerProcess
from tests.kinds import SECRET_MARKER
from tests.kit import otlp
from tests.kit.stack import Stack
from tests.kit.waiting import wait_until

NOTE = f"tenant-note {SECRET_MARKER}"


@pytest.fixture(scope="module")
def collector() -> Iterator[otlp.Collector]:
    with otlp.collector() as running:
        yield running


@pytest.fixture(scope="module")
def traced_web(bare_stack: Stack, collector: otlp.Collector) -> Iterator[str]:
    """`spacejobs web`, a worker and beat, each exporting to the collector."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
           "SPACEJOBS_RATE_LIMIT_FAIL": "open"}
    web, url = bare_stack.start_web(**env)
    worker, beat = bare_stack.start_worker(**env), bare_stack.start_beat(**env)
    yield url
    bare_stack.retire(web, worker, beat)


def test_one_trace_runs_from_the_submit_through_a_wait_and_a_retry_to_the_end(
        bare_stack: Stack, traced_web: str, collector: otlp.Collector) -> None:
    org = bare_stack.org()
    vera = bare_stack.user(org)
    answer = requests.post(f"{traced_web}/api/v1/orgs/{org}/jobs",
                           json={"kind": "test.traced", "params": {"note": NOTE}},
                           headers={"Authorization": f"Bearer {vera.token}"}, timeout=10)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    done = bare_stack.wait_for(job_id, "completed", timeout=30)
    assert done["attempts"] == 2
    trace_id = done["traceparent"].split("-")[1]

    def whole() -> list[otlp.ReceivedSpan] | None:
        spans = collector.trace(trace_id)
        outcomes = [s.attributes.get("spacejobs.outcome") for s in spans]
        return spans if "completed" in outcomes and any(s.kind == "server" for s in spans) else None

    spans = wait_until(whole, 15, interval=0.1, what=lambda: "the whole trace exported:\n"
                       + otlp.tree(collector.trace(trace_id)))
    print(f"\ntrace {trace_id}\n{otlp.tree(spans)}")

    server = next(s for s in spans if s.kind == "server")
    assert server.name == "POST /api/v1/orgs/<org>/jobs"
    assert server.service == "spacejobs-web"
    assert done["traceparent"].split("-")[2] == server.span_id  # the row names the request's span
    attempts = sorted((s for s in spans if s.name == "attempt test.traced"), key=lambda s: s.start)
    assert [(s.attributes["spacejobs.attempt"], s.attributes["spacejobs.outcome"])
            for s in attempts] == [(1, "waiting"), (1, "retry"), (2, "completed")]
    assert all(s.parent_id == server.span_id and s.service == "spacejobs-worker" for s in attempts)
    assert all(s.attributes["spacejobs.job.id"] == job_id for s in attempts)
    assert attempts[0].events == [("spacejobs.wait", {"spacejobs.wait.for": "moment"})]
    failed = attempts[1]
    assert failed.attributes["spacejobs.error.code"] == "internal_error"
    assert [name for name, _ in failed.events] == ["exception"]
    assert failed.events[0][1]["exception.type"] == "builtins.RuntimeError"
    steps = [s for s in spans if s.name == "spacejobs.step"]
    # the note's step and the sleep's (its moment), each run once: replayed after, never again
    assert [s.parent_id for s in steps] == [attempts[0].span_id] * 2

    # No tenant data anywhere: not the note (params), not the exception's message.
    carried = [value for span in collector.spans for value in span.values()]
    assert not [value for value in carried if "tenant-note" in value or "hunter2" in value]
    assert not [value for value in carried if value.startswith(("db.statement=", "http.target="))]


def test_a_request_no_route_matched_leaves_no_url_value_in_any_span(
        bare_stack: Stack, traced_web: str, collector: otlp.Collector) -> None:
    """Any client may ask for a URL that holds whatever it likes. Flask's instrumentation names
    the server span of a request no route matched (an unknown path, a method the path does not
    take) from the raw path: it leaves as the method alone; a matched route keeps its template."""
    org = bare_stack.org()
    vera = bare_stack.user(org)
    marker = f"ZXQ-{uuid.uuid4().hex}"
    base = f"{traced_web}/api/v1/orgs/{org}"
    asked = {"unknown path": ("GET", f"{base}/{marker}-path", 404, "GET"),
             "method not allowed": ("PUT", f"{base}/jobs/{marker}", 405, "PUT"),
             "matched route": ("GET", f"{base}/jobs/{marker}", 404,
                               "GET /api/v1/orgs/<org>/jobs/<job_id>")}
    traces = {}
    for what, (method, url, status, _) in asked.items():
        traces[what] = trace_id = uuid.uuid4().hex
        answer = requests.request(method, url, timeout=10, headers={
            "Authorization": f"Bearer {vera.token}",
            "traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"})
        assert answer.status_code == status, (what, answer.text)

    def server_spans() -> dict[str, otlp.ReceivedSpan] | None:
        found = {what: [s for s in collector.trace(trace_id) if s.kind == "server"]
                 for what, trace_id in traces.items()}
        return {what: spans[0] for what, spans in found.items()} if all(found.values()) else None

    servers = wait_until(server_spans, 15, "a server span of each request exported")
    print({what: span.name for what, span in servers.items()})
    for what, (_, _, _, name) in asked.items():
        assert servers[what].name == name, what
    carried = [value for span in collector.spans for value in span.values()]
    assert not [value for value in carried if marker in value]


def test_children_and_a_bulk_submit_carry_the_submitting_span(bare_stack: Stack,
                                                                traced_web: str) -> None:
    """The Python API stores the context of whatever span the application is in (its own
    tracing, here an SDK provider this test does not install globally); a fan-out's children
    take their parent's in the database."""
    org = bare_stack.org()
    vera = bare_stack.user(org)
    app_tracer = TracerProvider().get_tracer("the application")
    jobs = bare_stack.jobs
    with app_tracer.start_as_current_span("the application's work") as work:
        expected = tracing.format_traceparent(work.get_span_context())
        with bare_stack.app_db.begin() as conn:
            parent = jobs.submit(conn, "test.fan", {"parts": [{"n": 1}, {"n": 2}]},
                                 organization_id=org, requested_by=vera.id)
            bulk = jobs.submit_many(conn, [JobRequest("bench.noop"), JobRequest("bench.noop")],
                                    organization_id=org, requested_by=vera.id)
    bare_stack.wait_for(parent.job.id, "completed", timeout=30)
    with bare_stack.admin() as conn:
        stored = conn.execute(text(
            "SELECT id, traceparent FROM jobs WHERE id = ANY (CAST(:ids AS uuid[])) "
            "OR parent_id = :parent"),
            {"ids": [parent.job.id, *(j.id for j in bulk)], "parent": parent.job.id}).all()
    assert len(stored) == 5  # the parent, its two children, the bulk's two
    assert {row.traceparent for row in stored} == {expected}


def test_without_otel_variables_nothing_is_set_up(bare_stack: Stack,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    # The worker process's wiring, as a worker of this stack has it (with embedded servers the
    # test process itself has no DATABASE_URL).
    monkeypatch.setenv("DATABASE_URL", bare_stack.admin_url)
    monkeypatch.setenv("REDIS_URL", bare_stack.redis_url)
    settings = reload_settings()
    try:
        bare_stack.make_app()
        process = WorkerProcess(settings)
        assert not tracing.wanted(settings)
        assert tracing.tracer() is None  # this process does not trace
        assert process.spans is NO_SPANS
        # No provider installed: the API's proxy, whose spans are the no-op kind.
        assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider"
        org = bare_stack.org()
        vera = bare_stack.user(org)
        with bare_stack.app_db.begin() as conn:
            job = bare_stack.jobs.submit(conn, "bench.noop", organization_id=org,
                                         requested_by=vera.id)
        assert bare_stack.job_row(job.job.id)["traceparent"] is None
        process.engine.dispose()
    finally:
        monkeypatch.undo()
        reload_settings()

