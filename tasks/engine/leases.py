"""A worker process's side of the store: what it does with the jobs it leases.

Each method is one short transaction as the worker role around functions of
:mod:`models.jobs.store`. The runner (tasks/runner.py) talks only to this class, and its unit
tests to an in-memory fake of it (tests/unit/fake_leases.py), in the manner of a unit of work.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Engine

from spacejobs.models.db.transaction import transaction
from spacejobs.models.diagnostics import Diagnosis
from spacejobs.models.errors import DomainError, LeaseLost
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import KindControl, LeasedJob, Status
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.tenancy.access import check_allowed
from spacejobs.tasks.engine.context import Tenant


@dataclass(frozen=True)
class Finished:
    """A job that ran to its end and returned a result, waiting to be committed as completed."""

    job: LeasedJob
    rules: KindRules
    result: Any
    seconds: float = 0.0  # how long the attempt ran, for its log line
    #: the key of its file in the results store (written already), or None for an inline result
    result_ref: str | None = None


@dataclass
class FinishReport:
    """What one finish-and-claim transaction did."""

    completed: list[LeasedJob] = field(default_factory=list)
    #: completed jobs whose requester may no longer run them, failed instead, with the reason
    refused: list[tuple[LeasedJob, DomainError]] = field(default_factory=list)
    #: a newer attempt owns these jobs: their results were discarded (and their stored files
    #: are the caller's to delete)
    stale: list[LeasedJob] = field(default_factory=list)
    leased: list[LeasedJob] = field(default_factory=list)
    #: more jobs were due than this claim took
    more_due: bool = False
    #: where the next claim's turn among the organizations starts
    next_organization: UUID = store.NO_ORGANIZATION
    #: the soonest a full rate-limit window lets a job the claim held back start
    window_opens_at: datetime | None = None


@dataclass(frozen=True)
class Failure:
    """A failed attempt to record: the safe error and, for an unexpected exception, the detail
    that only operators may read. The detail is already a Diagnosis (models.diagnostics), not
    the exception: its message may quote the tenant's params or data, and nothing past the
    runner gets the chance to store it."""

    error: DomainError
    retry_in: float = 0.0
    diagnosis: Diagnosis | None = None


class WorkerLeases:
    def __init__(self, engine: Engine, worker: str) -> None:
        self.engine = engine
        self.worker = worker
        self.actor = f"worker:{worker}"

    # -- the hot path --------------------------------------------------------------------
    def finish_and_claim(
        self, finished: Sequence[Finished], *, claim: int,
        controls: list[KindControl] | None = None,
        after_organization: UUID = store.NO_ORGANIZATION,
    ) -> FinishReport:
        """ONE transaction: commit the finished jobs (the requesters' standing re-checked in one
        query, then one fenced UPDATE), then lease up to ``claim`` more.

        A transaction that only claims commits without waiting for the WAL flush. A crash can
        lose such a claim after this process was told it committed: the rows go back to what
        they were (queued, or leased by an expired holder) and are claimed again, while this
        process's attempt is fenced at its finish because its token was never durably recorded
        — the at-least-once run the lease already allows after a lost worker. Its finish, a
        durable commit, flushes the WAL up to and including the claim, so a recorded result
        never rests on a lost claim. A transaction that finishes anything is durable.
        """
        report = FinishReport()
        with transaction(self.engine, actor=self.actor, durable=bool(finished)) as conn:
            if finished:
                leases = [(f.job.id, f.job.lease_token) for f in finished]
                standing = store.lease_standing(conn, leases)
                allowed: list[Finished] = []
                for item in finished:
                    try:
                        check_allowed(standing.get(item.job.id), org_states=item.rules.org_states,
                                      role=item.rules.role, for_worker=True)
                    except DomainError as refusal:
                        status = store.fail_attempt(conn, item.job.id, item.job.lease_token, refusal,
                                                    retry_in=0)
                        if status is None:
                            report.stale.append(item.job)
                        else:
                            report.refused.append((item.job, refusal))
                    else:
                        allowed.append(item)
                done = store.complete_batch(
                    conn, [(f.job.id, f.job.lease_token, f.result, f.result_ref) for f in allowed])
                for item in allowed:
                    (report.completed if item.job.id in done else report.stale).append(item.job)
            if claim > 0:
                leased = store.claim_batch(conn, self.worker, limit=claim, controls=controls,
                                           after_organization=after_organization)
                report.leased, report.more_due = leased, leased.more_due
                report.next_organization = leased.next_organization
                report.window_opens_at = leased.window_opens_at
        return report

    def traceparents(self, job_ids: Sequence[UUID]) -> dict[UUID, str]:
        """The trace context each of these jobs was submitted in (read only while tracing)."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.traceparents(conn, job_ids)

    def claim_controls(self) -> list[KindControl]:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.claim_controls(conn)

    def extend(self, leases: Sequence[tuple[UUID, UUID]]) -> dict[UUID, Status]:
        """Heartbeat for every lease the process holds, in one statement."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.extend_leases(conn, leases)

    def cancels_asked(self, job_ids: Sequence[UUID]) -> set[UUID]:
        """Which of these held jobs were asked to cancel since they were leased."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.cancels_asked(conn, job_ids)

    # -- the other ends of an attempt ------------------------------------------------------
    def fail(self, job: LeasedJob, failure: Failure) -> Status | None:
        """Retry, fail or (if asked) cancel; None when the lease is no longer ours."""
        with transaction(self.engine, actor=self.actor) as conn:
            # The technical detail goes to operators only, never into error_message.
            status = store.fail_attempt(conn, job.id, job.lease_token, failure.error,
                                        retry_in=failure.retry_in, worker=self.worker,
                                        diagnosis=failure.diagnosis)
        return Status(status) if status is not None else None

    def acknowledge_cancel(self, job: LeasedJob) -> bool:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.acknowledge_cancel(conn, job.id, job.lease_token)

    def release(self, jobs: Sequence[LeasedJob]) -> set[UUID]:
        """Give jobs back untouched (shutdown); returns the ids given back."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.release_batch(conn, [(j.id, j.lease_token) for j in jobs])

    # -- what a running job's context needs (models.jobs.context.JobRuntime) ---------------
    @contextmanager
    def tenant(self, job: LeasedJob, rules: KindRules) -> Iterator[Tenant]:
        # Scoped by the lease itself: the worker role's policies on tenant tables admit only
        # the organization of a lease the transaction presents (lease_org() in the schema).
        with transaction(self.engine, organization_id=job.organization_id, actor=self.actor,
                         lease=(job.id, job.lease_token)) as conn:
            standing = store.lease_standing(conn, [(job.id, job.lease_token)]).get(job.id)
            if standing is None and store.lease_status(conn, job.id, job.lease_token) is None:
                raise LeaseLost()
            check_allowed(standing, org_states=rules.org_states, role=rules.role, for_worker=True)
            yield Tenant(conn, job.organization_id)
            if not store.lock_lease(conn, job.id, job.lease_token):
                raise LeaseLost()

    def record_progress(self, job: LeasedJob, progress: dict[str, Any]) -> Status | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.record_progress(conn, job.id, job.lease_token, progress)

    def lease_status(self, job: LeasedJob) -> Status | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.lease_status(conn, job.id, job.lease_token)

    def fan_out_state(self, job: LeasedJob) -> store.FanOut | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.fan_out_state(conn, job)

    def start_fan_out(self, job: LeasedJob, kind: KindRules, items: Sequence[dict[str, Any]],
                      max_parallel: int) -> store.FanOut | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.start_fan_out(conn, job, kind, items, max_parallel)

    def workflow_state(self, job: LeasedJob) -> store.WorkflowState | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.workflow_state(conn, job)

    def start_workflow(self, job: LeasedJob, steps: Sequence[store.StepPlan], policy: str,
                       max_parallel: int | None = None) -> store.WorkflowState | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.start_workflow(conn, job, steps, policy, max_parallel)

    def step_inputs(self, job: LeasedJob) -> list[Any]:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.step_inputs(conn, job)

    def children(self, job: LeasedJob) -> list[store.Child]:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.children(conn, job)

    def step_result(self, job: LeasedJob, name: str) -> tuple[bool, Any]:
        """A step the job recorded (LeaseLost when this attempt no longer holds it)."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.step_result(conn, job, name)

    def record_step(self, job: LeasedJob, name: str, result: Any) -> None:
        """Recorded only while this attempt holds the lease (LeaseLost otherwise)."""
        with transaction(self.engine, actor=self.actor) as conn:
            store.record_step(conn, job, name, result)

    def take_signal(self, job: LeasedJob, name: str, step: str) -> tuple[bool, Any]:
        """The oldest signal ``name`` not taken yet, taken and recorded as the step ``step`` in
        one fenced transaction: a later run finds the step, and no other wait takes it. What is
        returned is what was recorded: the payload with its sender."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.take_signal(conn, job, name, step)

    def wait(self, job: LeasedJob, until: datetime | None, signal: str | None,
             children: int | None) -> Status | None:
        """End this run to wait (waiting, or queued at once if the condition has come)."""
        with transaction(self.engine, actor=self.actor) as conn:
            return store.wait_job(conn, job.id, job.lease_token, until=until, signal=signal,
                                  children=children)

    def cancel_children(self, job: LeasedJob) -> int:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.cancel_children(conn, job)

    def start_failure_handler(self, job: LeasedJob, failure: dict[str, Any],
                              handler: KindRules) -> UUID | None:
        with transaction(self.engine, actor=self.actor) as conn:
            return store.start_failure_handler(conn, job, failure, handler)
