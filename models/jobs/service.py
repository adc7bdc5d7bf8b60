"""The one job API: every submit, read, list, cancel and wait of a job goes through a
:class:`Jobs`, whoever asks — the JSON API and the pages, the operators' dashboard, beat's
periodic jobs, the CLI and application code alike. Who may do what is decided here once (or in
the database function a method calls), never beside it.

One ``Jobs`` is built per process by its bootstrap (``spacejobs.connect()`` for a script, the
web's ``create_app``, the worker's process state), with the engine it reads with and the
publisher that sends wake-ups. Methods that act in the CALLER's transaction take its connection::

    import spacejobs

    jobs = spacejobs.connect()
    with jobs.engine.begin() as conn:
        order = create_order(conn, ...)              # the application's own writes
        submitted = jobs.submit(conn, "projects_export", organization_id=org, requested_by=user)
    # COMMIT: the row and the order exist together, and only now does the wake-up go out.
    # A rollback writes neither and sends nothing.

A submit checks the requester's current membership and the organization's state against the
kind's rules and writes the row and its event in one statement (``submit_jobs()`` in the
schema, a single submit being a batch of one).
A member's other operations take the :class:`~models.tenancy.access.Membership` that
:meth:`Jobs.member` (or the web's request transaction) read in the same transaction. Domain
errors (models.errors) say what was refused; nothing has been written when one is raised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack
from uuid import UUID

from sqlalchemy import Connection, Engine

from spacejobs.models.db.roles import listen_url
from spacejobs.models.db.transaction import after_commit, scope, transaction
from spacejobs.models.errors import (
    AlreadyResumed,
    DomainError,
    DuplicateJob,
    InvalidRequest,
    JobFinished,
    JobNotCompleted,
    NoStepWaits,
    NotFound,
    NotResumable,
    RequesterNotMember,
    ResultExpired,
    TooManySignals,
)
from spacejobs.models.jobs import canvas as canvases
from spacejobs.models.jobs import store, waiting
from spacejobs.models.jobs.holds import Waiting, why_waiting
from spacejobs.models.jobs.records import ACTIVE, Job, Status
from spacejobs.models.json_limits import (
    MAX_PARAMS_BYTES,
    MAX_SIGNAL_BYTES,
    check_depth,
    check_params,
    check_size,
    check_step_params,
)
from spacejobs.models.kinds import (
    SIGNAL_NAME,
    JobKind,
    KindRules,
    get_any_kind,
    get_kind,
    kind_roles,
    registered_kinds,
)
from spacejobs.models.ops import actions
from spacejobs.models.ops.dashboard import job_organization
from spacejobs.models.results.records import StoredResult
from spacejobs.models.tenancy import audit
from spacejobs.models.tenancy.access import (
    Membership,
    cancel_refused,
    check_may_read_result,
    may_cancel,
    may_read_result,
    require_membership,
)

log = logging.getLogger("spacejobs.jobs")

#: how many jobs one bulk submit may carry
MAX_BATCH = 1000
#: a job's priority among its organization's due jobs (the jobs.priority CHECK says the same)
MIN_PRIORITY, MAX_PRIORITY = -10, 10
#: a sequence's key (the jobs.sequence_key CHECK says the same) and the longest debounce
MAX_SEQUENCE_KEY, MAX_DEBOUNCE_SECONDS = 200, 86_400
#: a page of an organization's jobs holds at most this many
MAX_PAGE = 200
#: a signal's name: SIGNAL_NAME (models/kinds/rules.py); its payload's limits:
#: models/json_limits.py; the most signals a job may hold that it has not taken (signal_job()
#: in the schema holds it, and the payload's size)
MAX_PENDING_SIGNALS = 10
#: a job's page lists at most this many of its steps (then says how many more), as does a page
#: of them
MAX_STEPS_LISTED = 200
#: a page of a parent's steps' results holds at most this many (each up to the inline result's
#: 256 KiB: a larger result is a descriptor)
MAX_RESULTS_LISTED = 50

#: sends the wake-up for a committed job (tasks.wakeups.WakeupPublisher.wake); never raises
Wake = Callable[[str | None], object]


@dataclass(frozen=True)
class Submitted:
    job: Job
    created: bool  # False: an Idempotency-Key replay answered with the first job, or a debounce
    #: True: a queued job of the dedup_key that had not started took the params (and moved its
    #: start); ``job`` is that job
    debounced: bool = False


@dataclass(frozen=True)
class JobRequest:
    """One job as a caller asks for it, alone (:meth:`Jobs.submit_request`, which
    :meth:`Jobs.submit` builds one for) or in a batch (:meth:`Jobs.submit_many`): a single
    submit is a batch of one. :meth:`Jobs.submit` says what each field means."""

    kind: str
    params: dict[str, Any] | None = None
    dedup_key: str | None = None
    run_after: datetime | None = None
    priority: int = 0
    sequence_key: str | None = None
    debounce_seconds: int | None = None


@dataclass(frozen=True)
class JobRights:
    """What a member may do with one job, by the rules the actions enforce (the pages show
    only the buttons these allow)."""

    kind_role: str
    may_cancel: bool
    may_read_result: bool
    #: may send it a signal: who may cancel it (the rule :meth:`Jobs.signal` enforces), while
    #: it has not ended
    may_signal: bool = False
    #: a failed or cancelled workflow not resumed yet, which the member may cancel (so may
    #: resume) had it run
    may_resume: bool = False
    #: the workflow that resumed this one (or an operator's retry of it), if any
    resumed_as: UUID | None = None


@dataclass(frozen=True)
class Delivered:
    """Where a sent signal went: the job that holds it (the job it was sent to, or, for a
    workflow, the step within it that waits for that name) and that job's status after it
    (``queued`` when it was waiting for it)."""

    job_id: UUID
    status: Status


@dataclass(frozen=True)
class Outcome:
    """A job that ended, and its result (None unless it completed). A result in the results
    store is its descriptor here, and ``stored`` names the file (open it with the store)."""

    job: Job
    result: Any
    stored: StoredResult | None = None


class SubmitOptions(TypedDict, total=False):
    """What a submit may say besides its kind, params, organization and requester
    (:meth:`Jobs.submit` says what each means)."""

    dedup_key: str | None
    idempotency_key: str | None
    run_after: datetime | None
    priority: int
    request_id: str | None
    sequence_key: str | None
    debounce_seconds: int | None


class Jobs:
    """Every job operation, for one process.

    ``engine``: as the web role (space_app); :meth:`wait` and :meth:`transaction` open their
    own transactions on it. ``wake``: who sends the wake-up after a submit commits; without
    one, jobs still run (lingering workers hear the insert's NOTIFY, the sweeper re-signals due
    jobs), only later. ``operator_engine``: as space_operator, for the operators' actions on
    any organization's job (it finds the job's organization).
    """

    def __init__(self, engine: Engine, *, wake: Wake | None = None,
                 operator_engine: Engine | None = None) -> None:
        self.engine = engine
        # enqueue()'s: each statement its own transaction (the same pool, no BEGIN or COMMIT)
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._wake = wake
        self._operator_engine = operator_engine
        self._finishes: waiting.FinishListener | waiting.Unheard | None = None
        self._finishes_lock = threading.Lock()

    # -- who asks -------------------------------------------------------------------------------

    def member(self, conn: Connection, organization_id: UUID, user_id: UUID) -> Membership:
        """Scope the caller's transaction to the organization and the user, and read the user's
        CURRENT membership (NotFound for a non-member, as for a missing organization;
        OrganizationUnavailable for a deleted one)."""
        scope(conn, organization_id=organization_id, user_id=user_id, actor=f"user:{user_id}")
        return require_membership(conn, organization_id, user_id)

    @contextmanager
    def transaction(self, organization_id: UUID, user_id: UUID
                    ) -> Iterator[tuple[Connection, Membership]]:
        """A transaction of its own, scoped, with the user's current membership; commits unless
        the block raises (and then sends the wake-ups its submits registered)."""
        with transaction(self.engine, organization_id=organization_id, user_id=user_id,
                         actor=f"user:{user_id}") as conn:
            yield conn, require_membership(conn, organization_id, user_id)

    # -- submitting -----------------------------------------------------------------------------

    def submit(
        self,
        conn: Connection,
        kind: str,
        params: dict[str, Any] | None = None,
        *,
        organization_id: UUID,
        requested_by: UUID,
        dedup_key: str | None = None,
        idempotency_key: str | None = None,
        run_after: datetime | None = None,
        priority: int = 0,
        request_id: str | None = None,
        sequence_key: str | None = None,
        debounce_seconds: int | None = None,
    ) -> Submitted:
        """Queue one job in the caller's transaction; the wake-up goes out after COMMIT.

        ``run_after``: not before this moment. ``priority``: from -10 to 10, higher first among
        the organization's due jobs (organizations still take turns). ``sequence_key``: jobs of
        the organization with the same key run one at a time, in submit order, each once the
        one before it ended. ``debounce_seconds`` (with ``dedup_key``): while a job of the key is
        queued and has not started, this submit replaces its params and moves its start to
        ``debounce_seconds`` from now (``Submitted.debounced``); otherwise a new job starts that
        long from now.
        """
        return self.submit_request(
            conn, JobRequest(kind, params, dedup_key, run_after, priority, sequence_key,
                             debounce_seconds),
            organization_id=organization_id, requested_by=requested_by,
            idempotency_key=idempotency_key, request_id=request_id)

    def submit_request(self, conn: Connection, request: JobRequest, *, organization_id: UUID,
                       requested_by: UUID, idempotency_key: str | None = None,
                       request_id: str | None = None) -> Submitted:
        """:meth:`submit` of the job ``request`` asks for: a batch of one, through the same
        statement as :meth:`submit_many`."""
        (written,) = self._submit([request], organization_id=organization_id,
                                  requested_by=requested_by, request_id=request_id,
                                  idempotency_key=idempotency_key, conn=conn)
        job, outcome = written.job, written.outcome
        log.info(_SUBMIT_LOGS[outcome],
                 extra={"request_id": request_id, "job_id": str(job.id), "kind": job.kind,
                        "organization_id": str(job.organization_id), "attempt": 0})
        return Submitted(job, outcome == "created", debounced=outcome == "debounced")

    def enqueue(self, kind: str, params: dict[str, Any] | None = None, *,
                organization_id: UUID, requested_by: UUID,
                **options: Unpack[SubmitOptions]) -> Submitted:
        """Queue one job in a transaction of its own and send its wake-up; returns once the job
        is committed. The same checks and rows as :meth:`submit`, in one statement and one round
        trip to PostgreSQL (no BEGIN, no COMMIT of its own): for a caller with nothing else to
        commit with the job. Options as for :meth:`submit`."""
        with self._autocommit.connect() as conn:
            return self.submit(conn, kind, params, organization_id=organization_id,
                               requested_by=requested_by, **options)

    def submit_workflow(
        self,
        conn: Connection,
        canvas: canvases.Canvas | canvases.Handled,
        *,
        organization_id: UUID,
        requested_by: UUID,
        policy: canvases.Policy = "fail_fast",
        on_failure: canvases.Signature | None = None,
        idempotency_key: str | None = None,
        request_id: str | None = None,
    ) -> Submitted:
        r"""Queue a workflow (``chain``, ``group``, ``chord``, ``graph`` of ``sig``\ s, in
        models/jobs/canvas.py) as ONE job in the caller's transaction: all of it or nothing,
        the wake-up after COMMIT. Its steps become jobs as their dependencies complete; wait
        for the whole with :meth:`wait` on the returned job. ``on_failure`` (or
        ``canvas.on_failure(sig(...))``): a kind and its params run once, as a job of its own,
        if the workflow fails, checked now like a step (a refusal names ``on_failure``)."""
        bare, handler = canvases.split_handler(canvas, on_failure)
        for place, step in enumerate(canvases.compile_canvas(bare)):
            check_step_params(step.params, place)  # before pydantic serializes them (it recurses)
        if handler is not None:
            check_step_params(dict(handler.params), canvases.ON_FAILURE)
        return self.submit(conn, "workflow", canvases.workflow_params(bare, policy,
                                                                      on_failure=handler),
                           organization_id=organization_id, requested_by=requested_by,
                           idempotency_key=idempotency_key, request_id=request_id)

    def submit_many(
        self,
        conn: Connection,
        requests: Sequence[JobRequest],
        *,
        organization_id: UUID,
        requested_by: UUID,
        request_id: str | None = None,
    ) -> list[Job]:
        """Queue many jobs in one statement, all or nothing, in the caller's transaction.

        A refused item raises the same domain error a single submit would, with ``index`` (its
        place in ``requests``) in the error's details; nothing of the batch is then written.
        """
        if not 1 <= len(requests) <= MAX_BATCH:
            raise InvalidRequest(f"A batch holds 1 to {MAX_BATCH} jobs.", fields=["jobs"])
        written = self._submit(requests, organization_id=organization_id,
                               requested_by=requested_by, request_id=request_id, bulk=True,
                               conn=conn)
        log.info("%d jobs submitted", len(written), extra={
            "request_id": request_id, "organization_id": str(organization_id)})
        return [w.job for w in written]

    def _submit(self, requests: Sequence[JobRequest], *, conn: Connection, organization_id: UUID,
                requested_by: UUID, request_id: str | None, idempotency_key: str | None = None,
                retry_of: UUID | None = None, bulk: bool = False) -> list[store.Written]:
        """Every submit: validate each job by its kind's rules, write them in one statement,
        and register the wake-up for after COMMIT when any was created. A refused job of a
        ``bulk`` request names its ``index``."""
        new_jobs: list[store.NewJob] = []
        seen_keys: dict[tuple[str, str], int] = {}  # (kind, dedup key) -> its first index
        for index, item in enumerate(requests):
            try:
                new_jobs.append(_new_job(item))
            except DomainError as error:
                if bulk:
                    error.details["index"] = index
                raise
            if item.dedup_key is not None:
                earlier = seen_keys.setdefault((item.kind, item.dedup_key), index)
                if earlier != index:
                    raise DuplicateJob("The batch holds the same job twice.", index=index)
        # A batch of many in a savepoint: a duplicate undoes the batch's rows (a debounce's
        # too), not the caller's own earlier writes. One job writes nothing when refused, and
        # needs none (enqueue()'s autocommit connection could not take one).
        savepoint = conn.begin_nested() if len(new_jobs) > 1 else None
        try:
            written = store.submit(conn, new_jobs, organization_id=organization_id,
                                   requested_by=requested_by, request_id=request_id,
                                   idempotency_key=idempotency_key, retry_of=retry_of, bulk=bulk)
        except BaseException:
            if savepoint is not None:
                savepoint.rollback()
            raise
        if savepoint is not None:
            savepoint.commit()
        created = [w.job for w in written if w.outcome == "created"]
        if created:
            self._wake_after_commit(conn, str(created[0].id))
        return written

    # -- a member's reads and cancels -----------------------------------------------------------

    def get(self, conn: Connection, member: Membership, job_id: UUID) -> Job:
        """One of the member's organization's jobs (NotFound for any other: tenants never see
        each other's)."""
        job = store.get(conn, job_id)
        if job is None or job.organization_id != member.organization_id:
            raise NotFound()
        return job

    def page(self, conn: Connection, member: Membership, *, status: str | None = None,
             kind: str | None = None, before: tuple[datetime, UUID] | None = None,
             limit: int = 50) -> list[Job]:
        """The organization's jobs, newest first, older than ``before`` (created_at, id)."""
        if not 1 <= limit <= MAX_PAGE + 1:
            raise InvalidRequest(f"A page holds 1 to {MAX_PAGE} jobs.", fields=["limit"])
        return store.list_for_org(conn, member.organization_id, status=status, kind=kind,
                                  before=before, limit=limit)

    def running(self, conn: Connection, member: Membership, *, kind: str | None = None) -> list[Job]:
        """The organization's jobs someone runs now, oldest first (optionally of one kind)."""
        return store.running(conn, member.organization_id, kind=kind)

    def steps(self, conn: Connection, member: Membership, job: Job, *,
              limit: int = MAX_STEPS_LISTED, after: int = -1) -> store.Steps:
        """A parent job's steps (a workflow's) or parts (a fan-out's), in place order after the
        place ``after``, at most ``limit``, with how many there are in all; none for a job
        without children. Steps that are no job yet are listed too (no id, no status). Who may
        read the job (:meth:`get`) may read its steps' names, kinds and statuses, and nothing
        more of them: never their params, results or messages. One statement, under the
        caller's row-level security."""
        if job.organization_id != member.organization_id:
            raise NotFound()
        if not 1 <= limit <= MAX_STEPS_LISTED + 1:  # + 1: a page looks one step ahead
            raise InvalidRequest(f"A list of steps holds 1 to {MAX_STEPS_LISTED}.", fields=["limit"])
        return store.steps_of(conn, job.id, limit=limit, after=after)

    def step_results(self, conn: Connection, member: Membership, job_id: UUID, *,
                     limit: int = MAX_RESULTS_LISTED, after: int = -1,
                     request_id: str | None = None) -> tuple[Job, list[store.StepResult]]:
        """The results of a parent's completed steps so far, whatever the parent's own status
        (the partial results of a workflow that failed, was cancelled or still runs), in place
        order after the place ``after``, at most ``limit``: by the rule of the parent's own
        result, which carries them (the strictest role of everything it holds, InsufficientRole
        otherwise), so nobody reads a step's result through its parent that they could not read
        through the parent's result. NotFound for a job that is not the organization's. A read
        that returns any is written to the organization's audit log as a download of the
        parent's, in the caller's transaction."""
        if not 1 <= limit <= MAX_RESULTS_LISTED + 1:  # + 1: a page looks one step ahead
            raise InvalidRequest(f"A list of results holds 1 to {MAX_RESULTS_LISTED}.",
                                 fields=["limit"])
        parent = self.get(conn, member, job_id)
        check_may_read_result(member, store.role_needed(conn, job_id, kind_roles()) or "owner")
        results = store.step_results(conn, job_id, limit=limit, after=after)
        if results:
            audit.record_download(conn, parent, member.user_id, request_id)
        return parent, results

    def why_waiting(self, conn: Connection, jobs: Sequence[Job]) -> Mapping[UUID, Waiting]:
        """Why each of ``jobs`` that waits does (the JSON's ``waiting_reason``), by job id, read
        in ``conn``'s transaction under its scope: a waiting job's from its row, a queued job's
        sequence, delay or full rate limit window from one statement for all of them. A job
        that nothing holds back has no entry."""
        return why_waiting(conn, jobs)

    def rights(self, conn: Connection, member: Membership, job: Job) -> JobRights:
        """What the member may do with the job, by the rules the actions enforce: the role the
        job needs is its kind's, and for a parent the strictest of what it holds (read in the
        caller's transaction, as the cancel and the result read it)."""
        role = store.role_needed(conn, job.id, kind_roles()) or "owner"
        allowed = may_cancel(member, job.requested_by, role)
        resumable = job.kind == canvases.WORKFLOW_KIND and job.status in (Status.FAILED,
                                                                           Status.CANCELLED)
        resumed_as = store.resumed_as(conn, job.id) if resumable else None
        return JobRights(
            kind_role=role,
            may_cancel=job.status in ACTIVE and job.status != Status.CANCEL_REQUESTED and allowed,
            may_read_result=may_read_result(member, role),
            may_signal=job.status in ACTIVE and allowed,
            may_resume=resumable and resumed_as is None and allowed,
            resumed_as=resumed_as,
        )

    def cancel(self, conn: Connection, member: Membership, job_id: UUID,
               request_id: str | None = None) -> Job:
        """queued → cancelled at once; leased → cancel_requested (the job stops at its next safe
        point). The cancel statement applies the rule: the member started the job or holds the
        kind's role (InsufficientRole otherwise), reading the membership again in the same
        snapshot as the row it changes, and writes the organization's audit log. JobFinished
        for a job that had already ended."""
        return store.request_cancel(conn, job_id, member.user_id, request_id,
                                    kind_roles=kind_roles())

    def resume(self, conn: Connection, member: Membership, job_id: UUID,
               request_id: str | None = None) -> Job:
        """Resume a failed or cancelled workflow from its last completed steps, as a NEW workflow
        (its ``retry_of`` the old one; a terminal row never comes back) in the caller's
        transaction: the steps the old run completed are reused, never run again (their results
        are the new run's), and the failed, cancelled and never made ones run again. The same
        requester, the same steps and failure handler; the submit's checks (the requester's
        standing against every step's rules, the quota) apply as to any submit. Who may cancel
        the workflow may resume it (InsufficientRole otherwise): its requester, or a member
        holding the strictest role of what it holds. Written to the organization's audit log
        (``job.resume``). NotFound for another organization's job, NotResumable for a job that
        is not a failed or cancelled workflow (a kind's own ``ctx.workflow`` is its kind's to
        retry), AlreadyResumed once it was resumed (resume that one), RequesterNotMember once
        its requester left the organization. Returns the new workflow, queued; the wake-up goes
        out after COMMIT."""
        roles = kind_roles()
        old = self.get(conn, member, job_id)
        role = store.role_needed(conn, job_id, roles) or "owner"
        if not may_cancel(member, old.requested_by, role):
            raise cancel_refused(role)
        if old.kind != canvases.WORKFLOW_KIND or old.status not in (Status.FAILED, Status.CANCELLED):
            raise NotResumable(status=old.status)
        workflow_kind = get_kind(canvases.WORKFLOW_KIND)
        # The params as they were (the resume checks that it runs the same workflow), checked
        # again as a new submit is: a step's kind may have gone, or changed its params.
        params = dict(store.snapshot(conn, job_id)["params"])
        _validated(workflow_kind, params, None)
        rules = workflow_kind.rules
        parts = canvases.step_rules(params)
        # A savepoint: a refusal under the lock below undoes the new workflow, not the caller's
        # own earlier writes.
        savepoint = conn.begin_nested()
        try:
            try:
                (written,) = store.submit(
                    conn, [store.NewJob(canvases.rules_with_steps(rules, parts), params,
                                        parts=parts)],
                    organization_id=old.organization_id, requested_by=old.requested_by,
                    request_id=request_id, retry_of=job_id)
                new = written.job
            except NotFound:
                # The submit refuses a requester who left as it refuses anyone outside the
                # organization; to whoever resumes, that is not a missing job.
                raise RequesterNotMember() from None
            resumed = store.resume_workflow(conn, job_id, new.id, member.user_id, request_id,
                                            kind_roles=roles)
        except BaseException:
            savepoint.rollback()
            raise
        if resumed.outcome != "resumed":
            savepoint.rollback()
            if resumed.outcome == "refused":
                raise cancel_refused(role)
            if resumed.outcome == "already_resumed":
                raise AlreadyResumed(job_id=str(resumed.resumed_as))
            if resumed.outcome == "not_resumable":
                raise NotResumable(status=resumed.status)
            raise NotFound()
        savepoint.commit()
        self._wake_after_commit(conn, str(new.id))
        log.info("workflow resumed", extra={
            "request_id": request_id, "job_id": str(new.id), "kind": new.kind,
            "organization_id": str(new.organization_id), "attempt": 0})
        return new

    def signal(self, conn: Connection, member: Membership, job_id: UUID, name: str,
               payload: Any = None) -> Delivered:
        """Send the signal ``name`` with ``payload`` (JSON, at most 64 KiB, nesting arrays and
        objects at most 64 levels deep: models/json_limits.py) to a job of the
        member's organization; a wait of the job for that name takes it, now or later, once.
        A workflow takes no signal itself: one sent to it goes to the step within it (or a
        step's own child) that waits for that name now, the first by place, and NoStepWaits
        (nothing kept) when none does. Who may cancel the job may signal it (InsufficientRole
        otherwise): for a parent, the strictest rule of what it holds, so nobody signals a step
        through its workflow that they could not signal alone. The database keeps who sent it
        and their role, for the kind (``ctx.receive_signal``). NotFound for a job that is not
        the organization's, JobFinished for one that ended, TooManySignals when the job that
        would hold it already holds :data:`MAX_PENDING_SIGNALS` it has not taken. Returns which
        job holds the signal and its status after it (``queued`` when it was waiting for it)."""
        if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
            raise InvalidRequest("A signal's name is 1 to 64 letters, digits, '.', '_' or '-'.",
                                 fields=["name"])
        check_depth(payload, "A signal's payload", "payload")
        check_size(payload, "A signal's payload", "payload", MAX_SIGNAL_BYTES)
        target = self.get(conn, member, job_id)
        declared = registered_kinds().get(target.kind)
        if declared is not None:  # the model its kind declares for the signal, if any
            payload = declared.rules.parse_signal(name, payload)
        roles = kind_roles()
        sent = store.signal_job(conn, job_id, name, payload, member.user_id, kind_roles=roles)
        if sent.outcome == "not_found":
            raise NotFound()
        if sent.outcome == "finished":
            raise JobFinished(status=sent.status)
        if sent.outcome == "refused":
            raise cancel_refused(store.role_needed(conn, job_id, roles) or "owner")
        if sent.outcome == "too_large":
            raise InvalidRequest(f"A signal's payload holds at most {MAX_SIGNAL_BYTES // 1024} KiB.",
                                 fields=["payload"])
        if sent.outcome == "too_many":
            raise TooManySignals(limit=MAX_PENDING_SIGNALS)
        if sent.outcome == "no_step_waits":
            raise NoStepWaits()
        if sent.receiver is None or sent.status is None:
            raise RuntimeError(f"signal_job() answered {sent.outcome!r} without its receiver")
        if sent.status == Status.QUEUED:
            self._wake_after_commit(conn, str(sent.receiver))
        return Delivered(sent.receiver, sent.status)

    def result(self, conn: Connection, member: Membership, job_id: UUID,
               request_id: str | None = None) -> tuple[Job, Any, StoredResult | None]:
        """The result of a completed job, if the member holds the kind's role; JobNotCompleted
        (409) while it is not, ResultExpired (410) after retention dropped it.

        For a result in the results store, the result is its descriptor and the third value
        says which file to stream (the row's own key: a client never names one). The download
        is written to the organization's audit log in the caller's transaction."""
        found = store.get_result(conn, job_id, kind_roles=kind_roles())
        if found is None:
            raise NotFound()
        job, result, ref = found.job, found.result, found.ref
        # A parent's result carries its children's: it needs the strictest role of them all.
        check_may_read_result(member, found.role_needed or "owner")
        if job.status != Status.COMPLETED:
            raise JobNotCompleted(status=job.status)
        if job.result_expired_at is not None:
            raise ResultExpired()
        audit.record_download(conn, job, member.user_id, request_id)
        return job, result, StoredResult.from_row(ref, result) if ref else None

    def request_id_of(self, conn: Connection, job: Job) -> str | None:
        """The request id of the job's submit, for a failure's "contact support" line."""
        return store.request_id_of(conn, job.id)

    def wait(self, job_id: UUID, timeout: float, *, organization_id: UUID) -> Outcome:
        """Block until the job has ended, at most ``timeout`` seconds; TimeoutError after that.

        No polling: the finish NOTIFYs (models/jobs/waiting.py), and the row is read again only
        when it says so (and every few seconds, in case a notification was lost). Each read is
        its own short transaction, so no transaction stays open while waiting; any thread may
        wait (a Flask view, a Celery task). Behind a transaction-mode pooler without a direct
        URL to LISTEN on (models.db.roles.listen_url), it re-reads the row every
        ``waiting.RECHECK`` seconds.
        """
        finishes = self._finish_listener()
        deadline = time.monotonic() + timeout
        finishes.ready(timeout)
        announced = finishes.register(job_id)
        try:
            while True:
                with transaction(self.engine, organization_id=organization_id) as conn:
                    found = store.get_result(conn, job_id)
                if found is None:
                    raise NotFound()
                job, result, ref = found.job, found.result, found.ref
                if job.finished:
                    if job.status != Status.COMPLETED:
                        return Outcome(job, None)
                    return Outcome(job, result, StoredResult.from_row(ref, result) if ref else None)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"job {job_id} is still {job.status} after {timeout} s")
                announced.wait(min(left, waiting.RECHECK))
                announced.clear()
        finally:
            finishes.forget(job_id, announced)

    def close(self) -> None:
        """Stop the thread that hears finishes (started by the first :meth:`wait`). The engines
        are the caller's: they stay open."""
        with self._finishes_lock:
            if self._finishes is not None:
                self._finishes.close()
            self._finishes = None

    def _finish_listener(self) -> waiting.FinishListener | waiting.Unheard:
        with self._finishes_lock:
            if self._finishes is None:
                url = self.engine.url.render_as_string(hide_password=False)
                self._finishes = waiting.listener(listen_url(url))
            return self._finishes

    # -- operators ------------------------------------------------------------------------------

    def cancel_as_operator(self, job_id: UUID, *, operator_id: UUID,
                           request_id: str | None = None) -> Job:
        """Cancel any organization's job, as the operator (the same statement as a member's
        cancel; ``operator_id`` must be an operator's), written to the operator audit log."""
        with self._as_operator(job_id, operator_id) as conn:
            job = store.request_cancel(conn, job_id, operator_id, request_id, as_operator=True)
            actions.audit(conn, operator_id, "cancel", str(job_id), {"status": job.status},
                          request_id)
        return job

    def retry_as_new(self, job_id: UUID, *, operator_id: UUID,
                     request_id: str | None = None) -> Job:
        """A failed or cancelled job again, as a NEW job (new id, same snapshot), linked to the
        old one. Terminal states never come back; the requester's membership is re-checked by
        the submit as for any other."""
        with self._as_operator(job_id, operator_id) as conn:
            old = store.snapshot(conn, job_id)
            if old["status"] not in (Status.FAILED, Status.CANCELLED):
                raise InvalidRequest("Only a failed or cancelled job can be retried.")
            rules = get_any_kind(old["kind"]).rules
            if rules.child_only:
                # Alone, it would run for nobody: only its parent collects its result.
                raise InvalidRequest("This job is a part of a fan-out: retry its parent instead.")
            try:
                new = store.submit(conn, [store.NewJob(rules, old["params"])],
                                   organization_id=old["organization_id"],
                                   requested_by=old["requested_by"], request_id=request_id,
                                   retry_of=job_id)[0].job
            except NotFound:
                # The submit refuses a requester who left, as it refuses anyone outside the
                # organization; to an operator that is not a missing job.
                raise InvalidRequest("The job's requester is no longer a member of its "
                                     "organization; a new job would be refused.") from None
            actions.audit(conn, operator_id, "retry", str(job_id), {"new_job_id": str(new.id)},
                          request_id)
            self._wake_after_commit(conn, str(new.id))
        return new

    @contextmanager
    def _as_operator(self, job_id: UUID, operator_id: UUID) -> Iterator[Connection]:
        """A transaction in the job's organization, acting as the operator: the organization's
        audit log names them (the scoped user and the actor)."""
        if self._operator_engine is None:
            raise RuntimeError("operators' actions need Jobs(operator_engine=...)")
        with transaction(self._operator_engine) as conn:
            org = job_organization(conn, job_id)
        with transaction(self.engine, organization_id=org, user_id=operator_id,
                         actor=f"operator:{operator_id}") as conn:
            yield conn

    def _wake_after_commit(self, conn: Connection, job_id: str) -> None:
        publish = self._wake
        if publish is not None:
            after_commit(conn, lambda: publish(job_id))


_SUBMIT_LOGS = {"created": "job submitted", "replayed": "job submit replayed",
                "debounced": "job submit debounced"}


def _new_job(request: JobRequest) -> store.NewJob:
    """The job ``request`` asks for, validated by its kind's rules (a workflow with the
    strictest rules of its steps)."""
    job_kind = get_kind(request.kind)
    valid = _validated(job_kind, request.params, request.dedup_key, request.priority,
                       request.sequence_key)
    _check_debounce(request.debounce_seconds, request.dedup_key)
    parts = _parts(job_kind, valid)
    return store.NewJob(canvases.rules_with_steps(job_kind.rules, parts) if parts else job_kind.rules,
                        valid, request.dedup_key, request.run_after, request.priority,
                        request.sequence_key, request.debounce_seconds, parts=parts)


def _validated(job_kind: JobKind, params: dict[str, Any] | None, dedup_key: str | None,
               priority: int = 0, sequence_key: str | None = None) -> dict[str, Any]:
    if not (isinstance(priority, int) and MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise InvalidRequest(f"The priority is a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}.",
                             fields=["priority"])
    if sequence_key is not None and not (isinstance(sequence_key, str)
                                         and 1 <= len(sequence_key) <= MAX_SEQUENCE_KEY):
        raise InvalidRequest(f"A sequence key is 1 to {MAX_SEQUENCE_KEY} characters.",
                             fields=["sequence_key"])
    if dedup_key is not None and not job_kind.rules.dedupable:
        raise InvalidRequest("This kind of job cannot be de-duplicated.", fields=["dedup_key"])
    check_params(params, workflow=job_kind.rules.name == "workflow")  # before the kind's model
    result: dict[str, Any] = job_kind.parse_params(params).model_dump(mode="json")
    check_size(result, "A job's params", "params", MAX_PARAMS_BYTES)
    return result


def _check_debounce(debounce_seconds: int | None, dedup_key: str | None) -> None:
    if debounce_seconds is None:
        return
    if not (isinstance(debounce_seconds, int) and not isinstance(debounce_seconds, bool)
            and 1 <= debounce_seconds <= MAX_DEBOUNCE_SECONDS):
        raise InvalidRequest(f"debounce_seconds is a whole number from 1 to {MAX_DEBOUNCE_SECONDS}.",
                             fields=["debounce_seconds"])
    if dedup_key is None:
        raise InvalidRequest("A debounce needs a dedup_key: it names the job a later submit replaces.",
                             fields=["dedup_key"])



def _parts(job_kind: JobKind, params: dict[str, Any]) -> list[tuple[int | str, KindRules]]:
    """The rules of the jobs a submit starts through this one: a workflow's steps (its submit
    is checked against the strictest of them: models.jobs.canvases.rules_with_steps); none
    for any other kind."""
    if job_kind.rules.name == canvases.WORKFLOW_KIND:
        return canvases.step_rules(params)
    return []
