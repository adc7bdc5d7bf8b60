"""One attempt: re-check the leased job, run its kind, and turn how the run ended into a
decision (:data:`ON_EXCEPTION`, data a test reads) that :class:`~tasks.ends.Ends` writes.

A run that returned is not written here: its result joins the buffer of finished results
(tasks/finishes.py), committed with the next claim.

**A kind's traceback goes to the worker's log.** An unexpected exception fails the attempt
with ``internal_error`` (the user sees only that) and a :class:`~models.diagnostics.Diagnosis`
for operators (``job_diagnostics``, the dashboard). The same exception is logged here with
``exc_info``, so the worker's log shows the traceback a kind's author debugs with: the chain of
classes, each frame's file, line, function and source line. The log formatter (models/logs.py)
renders it through the same diagnosis, so the exception's *message* is withheld there too: it
may quote a tenant's params or data (a database error quotes the value it refused), and the
worker's log is read by whoever runs the workers, not only by the kind's author. The frame
and its source line say where it failed; a message meant for people belongs in a
:class:`~models.errors.DomainError`, whose safe message the user sees.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum
from typing import cast

from spacejobs.models.diagnostics import diagnose
from spacejobs.models.errors import (
    CancelRequested,
    DomainError,
    InternalJobError,
    LeaseLost,
    ReleaseRequested,
    UnknownKind,
    WaitRequested,
)
from spacejobs.models.jobs.canvas import AFTER, INPUTS
from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.kinds import JobKind
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.results.attempt import AttemptResults
from spacejobs.tasks.engine.context import JobContext, LeaseFlags
from spacejobs.tasks.engine.ends import Ends, Outcome, Stats
from spacejobs.tasks.engine.leases import Failure, Finished
from spacejobs.tasks.engine.ports import Ports, Signals
from spacejobs.tasks.engine.tracing import NO_SPANS, NoSpans

log = logging.getLogger("spacejobs.runner")


class Action(StrEnum):
    """What the end of a kind's run asks of the runner."""

    FINISH = "finish"  # it returned: the result joins the buffer for the batched finish
    NOTHING = "nothing"  # the lease is a newer attempt's: write nothing
    RELEASE = "release"  # give the lease back (shutdown), the attempt not counted
    ACKNOWLEDGE_CANCEL = "acknowledge_cancel"  # the user cancelled: stop at this safe point
    FAIL = "fail"  # the kind's own safe error: its code, retried if it is transient
    FAIL_INTERNAL = "fail_internal"  # a bug: internal_error, detail to operators and the log
    WAIT = "wait"  # the kind waits: give the lease and the slot back until its condition comes


#: What an exception out of a run means, first match wins. A domain error is the kind's own
#: safe message; anything else is an internal error whose detail goes to operators only.
ON_EXCEPTION: tuple[tuple[type[BaseException], Action], ...] = (
    (LeaseLost, Action.NOTHING),
    (ReleaseRequested, Action.RELEASE),
    (CancelRequested, Action.ACKNOWLEDGE_CANCEL),
    (WaitRequested, Action.WAIT),
    (DomainError, Action.FAIL),
    (Exception, Action.FAIL_INTERNAL),
)


def action_for(exc: BaseException | None) -> Action:
    """The decision for a run that raised ``exc`` (None: it returned)."""
    if exc is None:
        return Action.FINISH
    return next(action for kind, action in ON_EXCEPTION if isinstance(exc, kind))


class Attempt:
    """Runs one leased job to one of its ends."""

    def __init__(self, ports: Ports, signals: Signals, ends: Ends, stats: Stats, *,
                 clock: Callable[[], float] = time.monotonic, spans: NoSpans = NO_SPANS) -> None:
        self.ports = ports
        self.spans = spans
        self.signals = signals
        self.ends = ends
        self.stats = stats
        self.clock = clock
        self._on: dict[Action, Callable[[LeasedJob, KindRules, Exception], Outcome]] = {
            Action.NOTHING: lambda job, rules, exc: ends.lease_lost(job),
            Action.RELEASE: lambda job, rules, exc: ends.give_back([job]),
            Action.ACKNOWLEDGE_CANCEL: lambda job, rules, exc: ends.acknowledge_cancel(job),
            Action.FAIL: self._fail_safely,
            Action.FAIL_INTERNAL: self._fail_internally,
            Action.WAIT: lambda job, rules, exc: ends.wait(job, cast(WaitRequested, exc)),
        }

    def run(self, job: LeasedJob, kind: JobKind | None) -> Finished | None:
        """Run one leased job. A job that returned is handed back for the batched finish; every
        other end of the attempt is recorded here and now (:meth:`Ends.end` ends its span)."""
        with self.spans.running(job):
            return self._start(job, kind)

    def _start(self, job: LeasedJob, kind: JobKind | None) -> Finished | None:
        if kind is None:
            # A worker without this kind's code (e.g. mid-deploy) fails it and says so.
            self.ends.end(job, self.ends.fail(job, Failure(UnknownKind())))
            return None
        flags = self.ports.keeper.flags(job.id)
        if flags.cancel:  # asked while it waited in this process's batch
            self.ends.end(job, self.ends.acknowledge_cancel(job))
            return None
        return self._run(job, kind, flags)

    def after_exception(self, job: LeasedJob, rules: KindRules, exc: Exception) -> Outcome:
        """Record what ``exc`` out of the run means (:data:`ON_EXCEPTION`)."""
        return self._on[action_for(exc)](job, rules, exc)

    def _run(self, job: LeasedJob, kind: JobKind, flags: LeaseFlags) -> Finished | None:
        started = self.clock()
        rules = kind.rules
        results = AttemptResults(self.ports.results, job,
                                 inline_max_bytes=self.ports.inline_max_bytes)
        # A workflow's step names its dependencies beside its own params (only the database's
        # release of the step puts them there: a submit's params model refuses the keys); the
        # kind's params model reads only its own (models/jobs/canvas.py). A step made before
        # revision 0042 carries their results themselves.
        params = dict(job.params)
        reads_inputs = params.pop(AFTER, None) is not None
        inputs = params.pop(INPUTS, None)
        ctx = JobContext(self.ports.leases, job, rules, flags=flags,
                         deadline=started + rules.time_limit if rules.time_limit else None,
                         should_release=self.signals.release_due, results=results,
                         inputs=inputs, reads_inputs=reads_inputs)
        self.ports.keeper.running(job, rules, started)
        self.stats.running = 1
        try:
            result, ref = results.settle(kind.run(ctx, kind.parse_params(params)))
        except Exception as exc:
            results.discard()  # no finish will reference them
            self.ends.end(job, self.after_exception(job, rules, exc), self.clock() - started)
            return None
        finally:
            self.ports.keeper.idle()
            self.stats.running = 0
        return Finished(job, rules, result, self.clock() - started, result_ref=ref)

    def _fail_safely(self, job: LeasedJob, rules: KindRules, exc: Exception) -> Outcome:
        error = cast(DomainError, exc)  # ON_EXCEPTION sends only domain errors here
        self.spans.failed(job, exc)
        return self.ends.fail(job, Failure(error, retry_in=rules.backoff(job.attempt)))

    def _fail_internally(self, job: LeasedJob, rules: KindRules, exc: Exception) -> Outcome:
        diagnosis = diagnose(exc)
        self.spans.failed(job, exc)
        # The traceback for the kind's author; the formatter withholds the message (above).
        log.error("job raised %s", diagnosis.summary, exc_info=exc, extra=job.log_context)
        return self.ends.fail(job, Failure(InternalJobError(), retry_in=rules.backoff(job.attempt),
                                           diagnosis=diagnosis))
