"""Test an application's jobs against a real PostgreSQL, in the test's own process: run the jobs
that are due through the real worker engine, assert what the application submitted, and move
time for timers and retries.

The engine is the workers' own: a :class:`~spacejobs.tasks.engine.runner.Runner` over a
:class:`~spacejobs.tasks.engine.leases.WorkerLeases` on an engine of the worker role
(``space_worker``), so every claim, step, wait, signal, fan-out, finish and failure goes
through the same database functions, row-level security and fencing as in production. Only the
process around it is left out: no Celery, no Redis (a wake-up is a no-op: the test drains when
it wants), no heartbeat thread (a drain holds one job at a time and nothing else claims
meanwhile), no hard time limit (it kills a worker process; the soft one holds).

The harness needs the admin URL the tests migrate with (``DATABASE_URL``): it reads jobs and
moves time as the owner (``space_owner``, reached by ``SET ROLE``), the only role that may
write a job's moments, and runs jobs as the worker role derived from it
(:func:`~spacejobs.models.db.roles.role_url`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.roles import APP_ROLE, WORKER_ROLE, role_url
from spacejobs.models.db.transaction import owner_transaction, transaction
from spacejobs.models.errors import DomainError
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Job, KindControl, LeasedJob, Status
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import KindRules, Params
from spacejobs.models.results.configured import open_store
from spacejobs.models.results.store import ResultStore
from spacejobs.models.settings import get_settings
from spacejobs.models.tenancy import accounts
from spacejobs.tasks.engine.context import LeaseFlags
from spacejobs.tasks.engine.ends import Outcome
from spacejobs.tasks.engine.leases import Finished, FinishReport, WorkerLeases
from spacejobs.tasks.engine.runner import BatchSize, Ports, Runner, Signals, Tuning
from spacejobs.tasks.engine.tracing import NoSpans
from spacejobs.testing.memory import NotDue

__all__ = ["Drained", "Harness", "Member", "Ran", "assert_submitted", "refute_submitted",
           "submitted"]

Q = queries_beside(__file__)

#: who the harness is in job events and leases
ACTOR = "testing"
#: a moment moved to "now" lands this much in the past, so that both clocks (PostgreSQL's and
#: this process's, which the context reads) agree it has passed
_PAST = 0.05
#: how many times a drain moves time without anything running before it gives up
_IDLE_MOVES = 3

Statuses = str | Iterable[str] | None


@dataclass(frozen=True)
class Ran:
    """One attempt the harness ran: its job, kind and attempt number, how it ended (the
    engine's :class:`~spacejobs.tasks.engine.ends.Outcome`: ``completed``, ``waiting``,
    ``resumed``, ``retry``, ``failed``, ``cancelled``...), the exception the kind raised (a
    failure's), what it waits for (``moment``, ``signal``, ``children``) and, once completed,
    the job's result as the database holds it."""

    job_id: UUID
    kind: str
    attempt: int
    outcome: Outcome
    error: BaseException | None = None
    waits_for: str | None = None
    result: Any = None

    def __str__(self) -> str:
        error = f", raised {type(self.error).__name__}" if self.error is not None else ""
        waits = f" for a {self.waits_for}" if self.waits_for else ""
        return f"{self.kind} {self.job_id} attempt {self.attempt}: {self.outcome}{waits}{error}"


class Drained(list[Ran]):
    """The attempts one drain ran, in the order they ended."""

    def of(self, job_id: UUID | str) -> list[Ran]:
        """The attempts of one job."""
        return [ran for ran in self if str(ran.job_id) == str(job_id)]

    def outcomes(self) -> list[tuple[str, str]]:
        """``(kind, outcome)`` of each attempt, in order: a compact thing to assert on."""
        return [(ran.kind, str(ran.outcome)) for ran in self]

    def __str__(self) -> str:
        return "\n".join(str(ran) for ran in self) or "(nothing ran)"


@dataclass(frozen=True)
class Member:
    """A user the harness made, a member of an organization with a role."""

    organization_id: UUID
    user_id: UUID
    role: str


# -- what was submitted ------------------------------------------------------------------------

def submitted(conn: Connection, kind: str | None = None, *,
              params: Params | Mapping[str, Any] | None = None,
              organization_id: UUID | None = None, status: Statuses = None,
              include_children: bool = False) -> list[Job]:
    """The jobs submitted, oldest first, as ``conn`` may see them: a connection of the web
    role scoped to an organization (``jobs.transaction(org, user)``, or the request's) sees
    that organization's; the owner (:meth:`Harness.submitted`) every one. ``params``: only the
    jobs whose params hold these keys with these values. A fan-out's or a workflow's children
    are left out unless ``include_children``."""
    query = {"kind": kind, "org": organization_id, "statuses": _statuses(status),
             "children": include_children}
    if params is None:
        rows = conn.execute(Q["submitted"], query).mappings()
    else:
        query["params"] = json.dumps(_params_json(params))
        rows = conn.execute(Q["submitted_with_params"], query).mappings()
    return [Job.from_row(row) for row in rows]


def assert_submitted(conn: Connection, kind: str, *, params: Params | Mapping[str, Any] | None = None,
                     organization_id: UUID | None = None, status: Statuses = None,
                     count: int | None = None, include_children: bool = False) -> Job:
    """Assert that jobs of ``kind`` (and these params, organization, status) were submitted:
    at least one, or exactly ``count``. Returns the newest. The failure says what was
    submitted instead."""
    found = submitted(conn, kind, params=params, organization_id=organization_id, status=status,
                      include_children=include_children)
    if found and (count is None or len(found) == count):
        return found[-1]
    wanted = _described(kind, params, organization_id, status)
    others = submitted(conn, organization_id=organization_id, include_children=include_children)
    how_many = f"{count} jobs" if count is not None else "a job"
    raise AssertionError(f"expected {how_many} of {wanted}, found {len(found)}; submitted:\n"
                         + _listed(others))


def refute_submitted(conn: Connection, kind: str | None = None, *,
                     params: Params | Mapping[str, Any] | None = None,
                     organization_id: UUID | None = None, status: Statuses = None,
                     include_children: bool = False) -> None:
    """Assert that no job of ``kind`` (and these params, organization, status) was submitted."""
    found = submitted(conn, kind, params=params, organization_id=organization_id, status=status,
                      include_children=include_children)
    if found:
        raise AssertionError(f"expected no job of {_described(kind, params, organization_id, status)},"
                             f" found {len(found)}:\n" + _listed(found))


# -- the harness ---------------------------------------------------------------------------------

class Harness:
    """The real engine and the owner's hands on a test database, for one test module or session.

    ``admin_url``: what the tests migrate with (``DATABASE_URL``, ``spacejobs db upgrade``).
    ``results``: the results store the jobs write files and large results to (default: the
    settings', as a worker with these settings has; give the one your app was given).
    Connects lazily; :meth:`close` (or ``with Harness(...) as harness``) lets go of the
    connections. The kinds it runs are those registered in this process (import your kinds'
    modules, or call ``load_kinds()``).
    """

    def __init__(self, admin_url: str, *, results: ResultStore | None = None,
                 inline_max_bytes: int | None = None, worker: str | None = None) -> None:
        self.admin_url = admin_url
        self.owner_engine = make_engine(admin_url, pool_size=1, application_name="spacejobs-testing")
        self.worker_engine = make_engine(role_url(WORKER_ROLE, admin_url), pool_size=1,
                                         application_name="spacejobs-testing-worker")
        self.worker = worker or f"testing:{os.getpid()}"
        self._leases = _Leases(self.worker_engine, self.worker, self.owner_engine)
        self._results = results
        self._inline_max_bytes = inline_max_bytes
        self._app_engine: Engine | None = None
        self._jobs: Jobs | None = None

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.close()
        for engine in (self.owner_engine, self.worker_engine, self._app_engine):
            if engine is not None:
                engine.dispose()

    # -- what the application has ----------------------------------------------------------------
    @property
    def jobs(self) -> Jobs:
        """The job API as the web role (``space_app``) on this database, without wake-ups
        (the harness drains when the test says): what ``spacejobs.tasks.client.connect()``
        builds, for code under test that takes a ``Jobs``."""
        if self._jobs is None:
            self._app_engine = make_engine(role_url(APP_ROLE, self.admin_url), pool_size=2,
                                           application_name="spacejobs-testing-app")
            self._jobs = Jobs(self._app_engine)
        return self._jobs

    @property
    def results(self) -> ResultStore:
        if self._results is None:
            self._results = open_store(get_settings())
        return self._results

    def owner(self) -> AbstractContextManager[Connection]:
        """A transaction as the owner role, for what no application role may read or do."""
        return owner_transaction(self.owner_engine, actor=ACTOR)

    def organization(self, name: str | None = None, *, state: str = "active") -> UUID:
        """A new organization (``state``: active, read_only, ...), as the CLI makes one."""
        with self.owner() as conn:
            made = accounts.create_organization(conn, name or f"test-{uuid.uuid4().hex[:10]}")
            if state != "active":
                accounts.set_organization_state(conn, made, state)
        return made

    def member(self, role: str = "member", *, organization_id: UUID | None = None,
               email: str | None = None) -> Member:
        """A new user, a member of ``organization_id`` (a new organization when not given)
        with ``role``: someone to submit jobs as."""
        organization_id = organization_id or self.organization()
        with self.owner() as conn:
            user = accounts.create_user(conn, email or f"test-{uuid.uuid4().hex[:12]}@example.test")
            accounts.add_member(conn, organization_id, user.id, role)
        return Member(organization_id, user.id, role)

    # -- reading jobs ----------------------------------------------------------------------------
    def submitted(self, kind: str | None = None, *, params: Params | Mapping[str, Any] | None = None,
                  organization_id: UUID | None = None, status: Statuses = None,
                  include_children: bool = False) -> list[Job]:
        """:func:`submitted`, as the owner: every organization's jobs unless one is named."""
        with self.owner() as conn:
            return submitted(conn, kind, params=params, organization_id=organization_id,
                             status=status, include_children=include_children)

    def assert_submitted(self, kind: str, *, params: Params | Mapping[str, Any] | None = None,
                         organization_id: UUID | None = None, status: Statuses = None,
                         count: int | None = None, include_children: bool = False) -> Job:
        """:func:`assert_submitted`, as the owner."""
        with self.owner() as conn:
            return assert_submitted(conn, kind, params=params, organization_id=organization_id,
                                    status=status, count=count, include_children=include_children)

    def refute_submitted(self, kind: str | None = None, *,
                         params: Params | Mapping[str, Any] | None = None,
                         organization_id: UUID | None = None, status: Statuses = None,
                         include_children: bool = False) -> None:
        """:func:`refute_submitted`, as the owner."""
        with self.owner() as conn:
            refute_submitted(conn, kind, params=params, organization_id=organization_id,
                             status=status, include_children=include_children)

    def job(self, job_id: UUID | str) -> Job:
        """One job as it is now (as the owner); LookupError when there is none."""
        return Job.from_row(self.row(job_id))

    def row(self, job_id: UUID | str) -> dict[str, Any]:
        """Every column of one job as it is now, params, result and all (as the owner)."""
        with self.owner() as conn:
            found = conn.execute(Q["job_row"], {"id": str(job_id)}).mappings().one_or_none()
        if found is None:
            raise LookupError(f"there is no job {job_id}")
        return dict(found)

    def signal(self, job_id: UUID | str, name: str, payload: Any = None, *,
               sender: Member | UUID | None = None) -> Status | None:
        """Send a signal to a job through the job API (``Jobs.signal``), as ``sender`` (the
        job's requester when not given); the job's status after it (``queued``: it was waiting
        for it)."""
        job = self.job(job_id)
        user = sender.user_id if isinstance(sender, Member) else sender or job.requested_by
        with self.jobs.transaction(job.organization_id, user) as (conn, member):
            return self.jobs.signal(conn, member, job.id, name, payload).status

    # -- running jobs ----------------------------------------------------------------------------
    def drain(self, *, organization_id: UUID | None = None, kinds: Iterable[str] | None = None,
              limit: int = 100, with_timers: bool = False, raise_errors: bool = True) -> Drained:
        """Run the jobs that are due, one at a time in this process, until none is (or
        ``limit`` attempts ran), as a worker does: a waiting job's run ends ``waiting``; one
        that waits for what has already come (a signal sent before) runs again at once; a
        fan-out's children and a workflow's steps run as they become due, and their parent
        after them. Timers whose moment has passed are resumed first, as beat does.

        ``organization_id``: only that organization's jobs; ``kinds``: only jobs of these kinds
        (a child of another kind then waits). ``with_timers``: when nothing is due, move time
        to the next moment a job waits for (a timer, a retry's backoff, a later start, a
        signal's timeout) and go on, so sleeps and retries happen now. ``raise_errors``: an
        exception that is not a ``DomainError`` (a bug in a kind) is raised once the drain is
        over, after it was recorded as production records it (``internal_error``, retried);
        pass False to find it in ``Ran.error`` instead."""
        wanted = frozenset(kinds) if kinds is not None else None
        recorder = _Recorder()
        runner = self._runner(recorder, wanted)
        self._leases.hold(organization=organization_id)
        try:
            left, idle_moves = limit, 0
            while left > 0:
                self._resume_due_waits()
                ran = runner.drain_once(left)
                left -= ran
                if ran:
                    idle_moves = 0
                    continue
                if not with_timers or idle_moves >= _IDLE_MOVES:
                    break
                seconds = self._soonest(organization_id, wanted)
                if seconds is None:
                    break
                self._shift(max(0.0, seconds) + _PAST, organization_id=organization_id)
                idle_moves += 1
        finally:
            self._leases.hold()
        return self._report(recorder, raise_errors)

    def run_job(self, job_id: UUID | str, *, raise_errors: bool = True) -> Ran:
        """Run one attempt of one job now, through the real engine, whatever else is due: how
        it ended. :class:`NotDue` when it may not be claimed now (it waits, runs later, has
        ended, or a sequence, a rate limit or a paused kind holds it back): :meth:`signal`,
        :meth:`advance` or :meth:`make_due` first. ``raise_errors`` as for :meth:`drain`."""
        target = UUID(str(job_id))
        self._resume_due_waits()
        with self.owner() as conn:
            found = conn.execute(Q["job_due"], {"id": target}).mappings().one_or_none()
        if found is None:
            raise LookupError(f"there is no job {target}")
        due = dict(found)
        if not ((due["status"] == Status.QUEUED and due["due"])
                or (due["status"] == Status.LEASED and due["lease_ran_out"])):
            raise NotDue(_why_not_due(target, due))
        recorder = _Recorder()
        self._leases.hold(job=target, start_at=due["organization_id"])
        try:
            self._runner(recorder, None).drain_once(1)
        finally:
            self._leases.hold()
        report = self._report(recorder, raise_errors)
        if not report:
            raise NotDue(f"job {target} was not claimed: a sequence, a rate limit, a quota or a "
                         "paused kind holds it back")
        return report[0]

    # -- time ------------------------------------------------------------------------------------
    def advance(self, seconds: float = 0.0, *, minutes: float = 0.0, hours: float = 0.0,
                days: float = 0.0, organization_id: UUID | None = None) -> list[UUID]:
        """Let time pass for the jobs (every organization's, or one's): each moment an active
        job waits for comes that much sooner — a later start, a retry's backoff, a sleep's
        end, a signal wait's timeout, a lease's end, a rate limit's window — and the timers
        that have now come are resumed, as beat does. Returns the jobs it made due. As the
        owner: the only role that may move a job's moments."""
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total < 0:
            raise ValueError("time only moves forward")
        return self._shift(total, organization_id=organization_id)

    def make_due(self, job_id: UUID | str) -> list[UUID]:
        """Move time for one job to the moment it waits for: its later start or its retry's
        backoff, its sleep's end, its signal wait's timeout. The job is then due (a signal
        wait's next run raises SignalTimeout). ValueError for a job that waits for no moment
        (a signal wait always has its timeout; children have none)."""
        target = UUID(str(job_id))
        with self.owner() as conn:
            row = conn.execute(Q["until_due"], {"id": target}).mappings().one_or_none()
        if row is None:
            raise LookupError(f"there is no job {target}")
        if row["status"] not in (Status.QUEUED, Status.WAITING) or row["seconds"] is None:
            raise ValueError(f"job {target} is {row['status']} and waits for no moment"
                             + (" (it waits for its children)" if row["wait_children"] is not None
                                else ""))
        return self._shift(max(0.0, row["seconds"]) + _PAST, job_id=target)

    # -- the parts ---------------------------------------------------------------------------------
    def _runner(self, recorder: _Recorder, kinds: frozenset[str] | None) -> Runner:
        def controls() -> list[KindControl]:
            return self._controls(kinds)

        inline = self._inline_max_bytes or get_settings().result_inline_max_bytes
        return Runner(
            ports=Ports(leases=self._leases, keeper=_Keeper(), controls=controls,
                        results=self.results, inline_max_bytes=inline),
            # No broker: a wake-up, a fan-out's nudge and the linger are nothing; the test is
            # the one that drains.
            signals=Signals(),
            # One job at a time: nothing is held that a long job's lease could outlive.
            tuning=Tuning(BatchSize(1)),
            spans=recorder)

    def _controls(self, kinds: frozenset[str] | None) -> list[KindControl]:
        """The operators' controls, and every other kind paused when only some may run."""
        controls = self._leases.claim_controls()
        if kinds is None:
            return controls
        with transaction(self.worker_engine, actor=ACTOR) as conn:
            present = set(conn.execute(Q["active_kinds"]).scalars())
        others = present - kinds
        return ([c for c in controls if c.kind not in others]
                + [KindControl(kind, True, None) for kind in sorted(others)])

    def _resume_due_waits(self) -> None:
        """Beat's and the sweeper's resumes: waiting jobs whose moment has come, queued."""
        while True:
            with transaction(self.worker_engine, actor=ACTOR) as conn:
                resumed = store.resume_due_waits(conn, batch=500)
            if len(resumed) < 500:
                return

    def _soonest(self, organization_id: UUID | None, kinds: frozenset[str] | None) -> float | None:
        with self.owner() as conn:
            seconds: float | None = conn.execute(Q["soonest"], {
                "org": organization_id,
                "kinds": sorted(kinds) if kinds is not None else None}).scalar_one()
        return seconds

    def _shift(self, seconds: float, *, organization_id: UUID | None = None,
               job_id: UUID | None = None) -> list[UUID]:
        moved = {"seconds": seconds, "org": organization_id, "job": job_id}
        with self.owner() as conn:
            due = [row.id for row in conn.execute(Q["shift_jobs"], moved)]
            conn.execute(Q["shift_steps"], moved)
            if job_id is None:
                conn.execute(Q["shift_windows"], moved)
        with transaction(self.worker_engine, actor=ACTOR) as conn:
            resumed = [found for found, _kind in store.resume_due_waits(conn, batch=10_000)]
        return due + resumed

    def _report(self, recorder: _Recorder, raise_errors: bool) -> Drained:
        ran = recorder.ended
        completed = [r.job_id for r in ran if r.outcome == Outcome.COMPLETED]
        if completed:
            with self.owner() as conn:
                results = {row.id: row.result for row in conn.execute(
                    Q["results_of"], {"ids": completed})}
            ran = [dataclasses.replace(r, result=results.get(r.job_id))
                   if r.outcome == Outcome.COMPLETED else r for r in ran]
        drained = Drained(ran)
        if raise_errors:
            for each in drained:
                if each.error is not None and not isinstance(each.error, DomainError):
                    raise each.error
        return drained


class _Leases(WorkerLeases):
    """The worker's store adapter, whose claims may be held to one job or to one organization's
    jobs: for the claim's length, the owner locks every other row the claim could take
    (hold_back), and the claim's turn among the organizations starts at the one it is for."""

    def __init__(self, engine: Engine, worker: str, owner_engine: Engine) -> None:
        super().__init__(engine, worker)
        self.owner_engine = owner_engine
        self.only_job: UUID | None = None
        self.only_organization: UUID | None = None
        self.start_at: UUID | None = None

    def hold(self, *, job: UUID | None = None, organization: UUID | None = None,
             start_at: UUID | None = None) -> None:
        self.only_job, self.only_organization = job, organization
        self.start_at = start_at or organization

    def finish_and_claim(self, finished: Sequence[Finished], *, claim: int,
                         controls: list[KindControl] | None = None,
                         after_organization: UUID = store.NO_ORGANIZATION) -> FinishReport:
        if claim <= 0 or (self.only_job is None and self.only_organization is None):
            return super().finish_and_claim(finished, claim=claim, controls=controls,
                                            after_organization=after_organization)
        if self.start_at is not None:
            # The organizations are taken in turn from just after this one: it comes first.
            after_organization = UUID(int=(self.start_at.int - 1) % (1 << 128))
        with owner_transaction(self.owner_engine, actor=ACTOR) as conn:
            conn.execute(Q["hold_back"], {"job": self.only_job, "org": self.only_organization})
            return super().finish_and_claim(finished, claim=claim, controls=controls,
                                            after_organization=after_organization)


class _Keeper:
    """The runner's keeper without a heartbeat thread: the flags of the leases held, which the
    job's own writes (progress) set; one job is held at a time."""

    def __init__(self) -> None:
        self._flags: dict[UUID, LeaseFlags] = {}

    def hold(self, jobs: Sequence[LeasedJob]) -> None:
        for job in jobs:
            self._flags[job.id] = LeaseFlags()

    def drop(self, job_ids: Sequence[UUID]) -> None:
        for job_id in job_ids:
            self._flags.pop(job_id, None)

    def flags(self, job_id: UUID) -> LeaseFlags:
        return self._flags.setdefault(job_id, LeaseFlags())

    def running(self, job: LeasedJob, rules: KindRules, started: float) -> None:
        pass

    def idle(self) -> None:
        pass


class _Recorder(NoSpans):
    """The runner's spans, used to hear each attempt's end (and what it raised, what it waits
    for); nothing is traced."""

    def __init__(self) -> None:
        self.ended: list[Ran] = []
        self._errors: dict[UUID, BaseException] = {}
        self._waits: dict[UUID, str] = {}

    def failed(self, job: LeasedJob, exc: BaseException) -> None:
        self._errors[job.id] = exc

    def event(self, job: LeasedJob, name: str, attributes: Mapping[str, str | int | bool]) -> None:
        if name == "spacejobs.wait":
            self._waits[job.id] = str(attributes.get("spacejobs.wait.for"))

    def end(self, job: LeasedJob, outcome: str, *, failure: bool) -> None:
        self.ended.append(Ran(job.id, job.kind, job.attempt, Outcome(outcome),
                              self._errors.pop(job.id, None), self._waits.pop(job.id, None)))


def _statuses(status: Statuses) -> list[str] | None:
    if status is None:
        return None
    return [status] if isinstance(status, str) else [str(s) for s in status]


def _params_json(params: Params | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(params, Params):
        dumped: dict[str, Any] = params.model_dump(mode="json")
        return dumped
    # A UUID, a date as the submit stores them (the params model's JSON).
    stored: dict[str, Any] = json.loads(json.dumps(dict(params), default=str))
    return stored


def _described(kind: str | None, params: Any, organization_id: UUID | None, status: Statuses) -> str:
    parts = [f"kind {kind}" if kind else "any kind"]
    if params is not None:
        parts.append(f"params holding {_params_json(params)}")
    if organization_id is not None:
        parts.append(f"organization {organization_id}")
    if status is not None:
        parts.append(f"status {_statuses(status)}")
    return ", ".join(parts)


def _listed(jobs: Sequence[Job], most: int = 20) -> str:
    lines = [f"  {job.kind} {job.status} (organization {job.organization_id}, job {job.id})"
             for job in jobs[-most:]]
    if len(jobs) > most:
        lines.insert(0, f"  ... and {len(jobs) - most} earlier")
    return "\n".join(lines) or "  (nothing)"


def _why_not_due(job_id: UUID, due: Mapping[str, Any]) -> str:
    status = due["status"]
    if status == Status.WAITING:
        if due["wait_signal"] is not None:
            what = f"the signal {due['wait_signal']!r} (until {due['wait_until']})"
        elif due["wait_children"] is not None:
            what = "its children"
        else:
            what = f"its moment, {due['wait_until']}"
        return (f"job {job_id} waits for {what}: send the signal (harness.signal), move time "
                "(harness.advance, harness.make_due) or run its children first")
    if status == Status.QUEUED:
        return f"job {job_id} is queued to start later: harness.advance or harness.make_due first"
    return f"job {job_id} is {status}: only a queued job (or one whose lease ran out) is claimed"

