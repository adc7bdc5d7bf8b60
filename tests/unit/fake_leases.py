"""An in-memory stand-in for models.jobs.leases.WorkerLeases: the job rows as dicts, the same
transitions as store.sql (fenced by the lease token, a completion recording its result_ref and
a stale one reported as such), and a record of every call, so the runner's decisions can be
tested in milliseconds, without a database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from spacejobs.models.diagnostics import Diagnosis
from spacejobs.models.errors import DomainError, LeaseLost
from spacejobs.models.jobs.records import LeasedJob, Status
from spacejobs.models.jobs.store import Child, FanOut, StepPlan, WorkflowState
from spacejobs.models.kinds.rules import KindRules
from spacejobs.models.tenancy.access import check_allowed
from spacejobs.tasks.engine.context import Tenant
from spacejobs.tasks.engine.leases import Failure, Finished, FinishReport


@dataclass
class Row:
    id: UUID
    kind: str
    params: dict[str, Any]
    max_attempts: int = 3
    status: Status = Status.QUEUED
    attempts: int = 0
    lease_token: UUID | None = None
    result: Any = None
    result_ref: str | None = None
    error_code: str | None = None
    progress: dict[str, Any] | None = None
    diagnostics: list[Diagnosis] = field(default_factory=list)
    organization_id: UUID = field(default_factory=uuid.uuid4)
    requested_by: UUID = field(default_factory=uuid.uuid4)
    parent: UUID | None = None
    child_index: int | None = None
    steps: dict[str, Any] = field(default_factory=dict)
    signals: list[tuple[str, Any]] = field(default_factory=list)  # not taken yet, oldest first
    waits_for: tuple[Any, str | None, bool] | None = None  # (until, signal, children)


@dataclass(frozen=True)
class FakeStanding:
    role: str = "owner"
    organization_state: str = "active"


class FakeLeases:
    def __init__(self) -> None:
        self.rows: dict[UUID, Row] = {}
        self.calls: list[str] = []
        self.members: dict[UUID, FakeStanding] = {}  # job id -> its requester's standing
        self.broken = False  # every call raises, as with the database gone
        self.handlers: dict[UUID, dict[str, Any]] = {}  # workflow id -> its handler's failure

    # -- set-up ----------------------------------------------------------------------------
    def add(self, kind: str, params: dict[str, Any] | None = None, **row: Any) -> UUID:
        job = Row(uuid.uuid4(), kind, params or {}, **row)
        self.rows[job.id] = job
        self.members[job.id] = FakeStanding()
        return job.id

    def steal(self, job_id: UUID) -> None:
        """A newer attempt takes the lease (as after an expiry)."""
        self.rows[job_id].lease_token = uuid.uuid4()

    def status(self, job_id: UUID) -> Status:
        return self.rows[job_id].status

    # -- WorkerLeases ----------------------------------------------------------------------
    def finish_and_claim(self, finished: Sequence[Finished], *, claim: int,
                         controls: list[Any] | None = None,
                         after_organization: UUID | None = None) -> FinishReport:
        self._call(f"finish_and_claim({len(finished)}, claim={claim})")
        report = FinishReport()
        for item in finished:
            row = self.rows[item.job.id]
            if not self._holds(row, item.job):
                report.stale.append(item.job)
                continue
            try:
                check_allowed(self.members.get(row.id), org_states=item.rules.org_states,
                              role=item.rules.role, for_worker=True)
            except DomainError as refusal:
                self._fail_row(row, Failure(refusal))
                report.refused.append((item.job, refusal))
                continue
            row.status, row.result, row.lease_token = Status.COMPLETED, item.result, None
            row.result_ref = item.result_ref
            report.completed.append(item.job)
        due = [r for r in self.rows.values() if r.status == Status.QUEUED]
        report.more_due = claim > 0 and len(due) > claim
        for row in due[:claim]:
            row.status, row.lease_token = Status.LEASED, uuid.uuid4()
            row.attempts += 1
            report.leased.append(LeasedJob(
                id=row.id, organization_id=row.organization_id, requested_by=row.requested_by,
                kind=row.kind, params=row.params, attempt=row.attempts,
                max_attempts=row.max_attempts, lease_token=row.lease_token, lease_seconds=30,
                request_id=None))
        return report

    def fail(self, job: LeasedJob, failure: Failure) -> Status | None:
        self._call(f"fail({failure.error.code})")
        row = self.rows[job.id]
        if not self._holds(row, job):
            return None
        return self._fail_row(row, failure)

    def acknowledge_cancel(self, job: LeasedJob) -> bool:
        self._call("acknowledge_cancel")
        row = self.rows[job.id]
        if not self._holds(row, job) or row.status != Status.CANCEL_REQUESTED:
            return False
        row.status, row.lease_token = Status.CANCELLED, None
        return True

    def release(self, jobs: Sequence[LeasedJob]) -> set[UUID]:
        self._call(f"release({len(jobs)})")
        released = set()
        for job in jobs:
            row = self.rows[job.id]
            if self._holds(row, job) and row.status == Status.LEASED:
                row.status, row.lease_token = Status.QUEUED, None
                row.attempts -= 1
                released.add(job.id)
        return released

    def extend(self, leases: Sequence[tuple[UUID, UUID]]) -> dict[UUID, Status]:
        self._call(f"extend({len(leases)})")
        return {job_id: self.rows[job_id].status for job_id, token in leases
                if self.rows[job_id].lease_token == token}

    @contextmanager
    def tenant(self, job: LeasedJob, rules: KindRules) -> Iterator[Tenant]:
        self._call("tenant")
        check_allowed(self.members.get(job.id), org_states=rules.org_states, role=rules.role,
                      for_worker=True)
        yield Tenant(None, job.organization_id)  # type: ignore[arg-type]
        if not self._holds(self.rows[job.id], job):
            raise LeaseLost()

    def record_progress(self, job: LeasedJob, progress: dict[str, Any]) -> Status | None:
        self._call("record_progress")
        row = self.rows[job.id]
        if not self._holds(row, job):
            return None
        row.progress = progress
        return row.status

    def lease_status(self, job: LeasedJob) -> Status | None:
        row = self.rows[job.id]
        return row.status if self._holds(row, job) else None

    def _make_children(self, job: LeasedJob, kind: KindRules,
                       items: Sequence[tuple[int, dict[str, Any]]]) -> int:
        parent = self.rows[job.id]
        if not self._holds(parent, job) or parent.status != Status.LEASED:
            return 0
        made = 0
        for index, params in items:
            if any(r.parent == job.id and r.child_index == index for r in self.rows.values()):
                continue
            child = Row(uuid.uuid4(), kind.name, params, organization_id=parent.organization_id,
                        requested_by=parent.requested_by, parent=job.id, child_index=index)
            self.rows[child.id] = child
            made += 1
        return made

    def fan_out_state(self, job: LeasedJob) -> FanOut | None:
        """fan_out_state() in miniature (the runner's tests never start one)."""
        if not self._holds(self.rows[job.id], job):
            raise LeaseLost()
        return None

    def start_fan_out(self, job: LeasedJob, kind: KindRules, items: Sequence[dict[str, Any]],
                      max_parallel: int) -> FanOut | None:
        """start_fan_out() in miniature: the first max_parallel children, none released later
        (the runner's tests never end a child)."""
        self._call(f"start_fan_out({len(items)})")
        made = self._make_children(job, kind, list(enumerate(items))[:max_parallel])
        if not made and items:
            return None
        return FanOut(len(items), made, 0)

    def workflow_state(self, job: LeasedJob) -> WorkflowState | None:
        """workflow_state() in miniature (the runner's tests never start one)."""
        if not self._holds(self.rows[job.id], job):
            raise LeaseLost()
        return None

    def start_workflow(self, job: LeasedJob, steps: Sequence[StepPlan], policy: str,
                       max_parallel: int | None = None) -> WorkflowState | None:
        """start_workflow() in miniature: the steps that wait for none, made."""
        self._call(f"start_workflow({len(steps)})")
        if not self._holds(self.rows[job.id], job):
            return None
        made = sum(self._make_children(job, step.kind, [(place, step.params)])
                   for place, step in enumerate(steps) if not step.after and not step.waits)
        return WorkflowState(len(steps), made, 0, 0)

    def children(self, job: LeasedJob) -> list[Child]:
        return sorted((Child(r.child_index, r.id, r.status, r.result, r.error_code, None)
                       for r in self.rows.values() if r.parent == job.id), key=lambda c: c.index)

    def start_failure_handler(self, job: LeasedJob, failure: dict[str, Any],
                              handler: KindRules) -> UUID | None:
        """start_failure_handler() in miniature: what it was given, once per workflow."""
        self._call("start_failure_handler")
        if not self._holds(self.rows[job.id], job):
            return None
        self.handlers.setdefault(job.id, failure)
        return job.id

    def cancel_children(self, job: LeasedJob) -> int:
        self._call("cancel_children")
        touched = 0
        for row in self.rows.values():
            if row.parent == job.id and row.status in (Status.QUEUED, Status.LEASED):
                row.status = Status.CANCELLED if row.status == Status.QUEUED else Status.CANCEL_REQUESTED
                touched += 1
        return touched

    def step_result(self, job: LeasedJob, name: str) -> tuple[bool, Any]:
        row = self.rows[job.id]
        if not self._holds(row, job):
            raise LeaseLost()
        return (name in row.steps, row.steps.get(name))

    def step_inputs(self, job: LeasedJob) -> list[Any]:
        """step_inputs() in miniature: the results of the siblings the step's row names."""
        row = self.rows[job.id]
        if not self._holds(row, job):
            raise LeaseLost()
        siblings = {r.child_index: r.result for r in self.rows.values()
                    if r.parent is not None and r.parent == row.parent}
        return [siblings.get(place) for place in row.params.get("_after", [])]

    def record_step(self, job: LeasedJob, name: str, result: Any) -> None:
        self._call(f"record_step({name})")
        row = self.rows[job.id]
        if not self._holds(row, job):
            raise LeaseLost()
        row.steps.setdefault(name, result)

    def take_signal(self, job: LeasedJob, name: str, step: str) -> tuple[bool, Any]:
        row = self.rows[job.id]
        if not self._holds(row, job):
            raise LeaseLost()
        for place, (sent, payload) in enumerate(row.signals):
            if sent == name:
                del row.signals[place]
                recorded = {"_taken_signal": {"payload": payload, "sent_by": None,
                                              "sender_role": None, "sent_at": None}}
                row.steps.setdefault(step, recorded)
                return True, recorded
        return False, None

    def wait(self, job: LeasedJob, until: Any, signal: str | None,
             children: int | None) -> Status | None:
        """wait_job() in miniature: waiting in the attempt it ran in, or queued at once, its
        attempt given back for the next claim, when a signal already came."""
        self._call("wait")
        row = self.rows[job.id]
        if row.lease_token != job.lease_token or row.status != Status.LEASED:
            return None
        row.lease_token = None
        if signal is not None and any(sent == signal for sent, _ in row.signals):
            row.status, row.attempts = Status.QUEUED, row.attempts - 1
        else:
            row.status, row.waits_for = Status.WAITING, (until, signal, children)
        return row.status

    # -- the rules of store.sql, in miniature ------------------------------------------------
    @staticmethod
    def _holds(row: Row, job: LeasedJob) -> bool:
        return (row.lease_token == job.lease_token
                and row.status in (Status.LEASED, Status.CANCEL_REQUESTED))

    def _fail_row(self, row: Row, failure: Failure) -> Status:
        if row.status == Status.CANCEL_REQUESTED:
            row.status = Status.CANCELLED
        elif failure.error.permanent or row.attempts >= row.max_attempts:
            row.status = Status.FAILED
        else:
            row.status = Status.QUEUED
        row.error_code, row.lease_token = failure.error.code, None
        if failure.diagnosis is not None:
            row.diagnostics.append(failure.diagnosis)
        return row.status

    def _call(self, name: str) -> None:
        if self.broken:
            raise ConnectionError("database gone")
        self.calls.append(name)

