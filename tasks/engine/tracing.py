"""The worker's spans: one per attempt, a child of the trace context its job was submitted in.

An attempt's span starts when the runner starts the attempt (tasks/attempt.py) and ends with
the attempt's one end (:meth:`tasks.ends.Ends.end`: a completion in the batched finish, a
failure, a retry, a wait, a cancel, a give-back). Its parent is the job row's ``traceparent``,
so every attempt of a job (and every child of a fan-out or workflow, which inherits its
parent's) hangs under the request that submitted it; the Celery task that ran the drain, if
any, is a link. Durable steps are child spans (models/jobs/context.py), a wait is an event.

Attributes are ids, kinds, attempt numbers, outcomes and error codes only (models/tracing.py).
With tracing off the runner holds :data:`NO_SPANS`, whose every method does nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanKind, StatusCode

from spacejobs.models import tracing
from spacejobs.models.jobs.records import LeasedJob

log = logging.getLogger("spacejobs.tracing")

_NOTHING = contextlib.nullcontext()


class NoSpans:
    """Tracing off: nothing is made, nothing is read."""

    def claimed(self, jobs: Sequence[LeasedJob]) -> None:
        """These jobs were leased: their trace contexts are read here, once per claim."""

    def running(self, job: LeasedJob) -> contextlib.AbstractContextManager[object]:
        """Start ``job``'s attempt span; the block runs with it current."""
        return _NOTHING

    def forget(self, jobs: Sequence[LeasedJob]) -> None:
        """These jobs were given back unstarted: no attempt of theirs runs here."""

    def failed(self, job: LeasedJob, exc: BaseException) -> None:
        """The run raised ``exc`` (its class is recorded, never its message)."""

    def note(self, job: LeasedJob, attributes: Mapping[str, str | int | bool]) -> None:
        """More of the attempt's ids and codes (an error code)."""

    def event(self, job: LeasedJob, name: str, attributes: Mapping[str, str | int | bool]) -> None:
        """Something that happened in the attempt (it began to wait)."""

    def end(self, job: LeasedJob, outcome: str, *, failure: bool) -> None:
        """The attempt is over: end its span with ``outcome``."""


NO_SPANS = NoSpans()


class AttemptSpans(NoSpans):
    """One span per attempt, parented by the stored trace context (one read per claim)."""

    def __init__(self, tracer: trace.Tracer,
                 traceparents: Callable[[Sequence[UUID]], dict[UUID, str]]) -> None:
        self.tracer = tracer
        self.traceparents = traceparents
        self._parents: dict[UUID, str] = {}
        self._open: dict[UUID, trace.Span] = {}

    def claimed(self, jobs: Sequence[LeasedJob]) -> None:
        if not jobs:
            return
        try:
            self._parents.update(self.traceparents([job.id for job in jobs]))
        except Exception:
            # Traces are never worth a job: its attempt's span starts a trace of its own.
            log.warning("could not read the leased jobs' trace contexts", exc_info=True)

    def running(self, job: LeasedJob) -> contextlib.AbstractContextManager[object]:
        parent = tracing.parse_traceparent(self._parents.pop(job.id, None))
        current = trace.get_current_span().get_span_context()
        context, links = None, []
        if parent is not None:
            context = trace.set_span_in_context(NonRecordingSpan(parent))
            if current.is_valid:
                links.append(Link(current))  # the Celery task (the drain) that ran it
        span = self.tracer.start_span(
            f"attempt {job.kind}", context=context, kind=SpanKind.CONSUMER, links=links,
            attributes={"spacejobs.job.id": str(job.id), "spacejobs.job.kind": job.kind,
                        "spacejobs.organization.id": str(job.organization_id),
                        "spacejobs.attempt": job.attempt,
                        "spacejobs.max_attempts": job.max_attempts},
            record_exception=False, set_status_on_exception=False)
        self._open[job.id] = span
        return trace.use_span(span, end_on_exit=False, record_exception=False,
                              set_status_on_exception=False)

    def forget(self, jobs: Sequence[LeasedJob]) -> None:
        for job in jobs:
            self._parents.pop(job.id, None)

    def failed(self, job: LeasedJob, exc: BaseException) -> None:
        span = self._open.get(job.id)
        if span is not None:
            tracing.record_exception(span, exc)

    def note(self, job: LeasedJob, attributes: Mapping[str, str | int | bool]) -> None:
        span = self._open.get(job.id)
        if span is not None:
            span.set_attributes(attributes)

    def event(self, job: LeasedJob, name: str, attributes: Mapping[str, str | int | bool]) -> None:
        span = self._open.get(job.id)
        if span is not None:
            span.add_event(name, attributes)

    def end(self, job: LeasedJob, outcome: str, *, failure: bool) -> None:
        self._parents.pop(job.id, None)
        span = self._open.pop(job.id, None)
        if span is None:
            return
        span.set_attribute("spacejobs.outcome", str(outcome))
        if failure:
            span.set_status(StatusCode.ERROR)
        span.end()
