"""Every attempt the runner starts is one span that ends once, with its outcome, parented by
the job's stored trace context: the runner against the in-memory leases, spans to the SDK's
in-memory exporter (through SafeSpans, as a tracing process exports them)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from uuid import UUID

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from spacejobs.models.trace_setup import SafeSpans
from spacejobs.tasks.engine.tracing import AttemptSpans
from tests.unit.test_runner import UNSAFE_MESSAGE, Harness

SUBMITTED_IN = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"


def test_each_attempt_is_one_span_under_the_submit_with_its_outcome_and_no_message() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SafeSpans(SimpleSpanProcessor(exported)))
    h = Harness()
    stored: dict[UUID, str] = {}

    def traceparents(ids: Sequence[UUID]) -> dict[UUID, str]:
        return {job_id: stored[job_id] for job_id in ids if job_id in stored}

    spans = AttemptSpans(provider.get_tracer("test"), traceparents)
    runner = dataclasses.replace(h.runner, spans=spans)
    ok, refused, crash = h.leases.add("unit.ok"), h.leases.add("unit.refused"), h.leases.add("unit.crash")
    untraced = h.leases.add("unit.ok")
    stored.update({ok: SUBMITTED_IN, refused: SUBMITTED_IN, crash: SUBMITTED_IN})

    runner.drain(10)

    finished = exported.get_finished_spans()
    outcomes: dict[str, list[tuple[object, object]]] = {}
    for span in finished:
        attributes = span.attributes or {}
        outcomes.setdefault(str(attributes["spacejobs.job.id"]), []).append(
            (attributes["spacejobs.attempt"], attributes["spacejobs.outcome"]))
    # the in-memory leases have no backoff: the crash is retried at once, to its third and last
    assert outcomes == {str(ok): [(1, "completed")], str(refused): [(1, "failed")],
                        str(crash): [(1, "retry"), (2, "retry"), (3, "failed")],
                        str(untraced): [(1, "completed")]}
    ended = {str((span.attributes or {})["spacejobs.job.id"]): span for span in finished}
    parent = SUBMITTED_IN.split("-")[1:3]
    for job_id in (ok, refused, crash):
        span = ended[str(job_id)]
        assert span.parent is not None
        assert [f"{span.context.trace_id:032x}", f"{span.parent.span_id:016x}"] == parent
    assert ended[str(untraced)].parent is None  # no stored context: a trace of its own
    assert ended[str(crash)].status.status_code is StatusCode.ERROR
    assert (ended[str(crash)].attributes or {})["spacejobs.error.code"] == "internal_error"
    assert [dict(e.attributes or {})["exception.type"] for e in ended[str(crash)].events] == [
        "builtins.ZeroDivisionError"]
    shown = repr([(s.name, s.attributes, [e.attributes for e in s.events]) for s in finished])
    assert UNSAFE_MESSAGE not in shown
    assert not spans._open and not spans._parents  # nothing left behind
