"""The job runner: claim → execute in tenant-scoped transactions under a heartbeat → fenced finish.

Every decision about the job's state is a function of models.jobs; this module only sequences
them and turns exceptions into the right transition.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from models.db.transaction import transaction
from models.errors import (
    CancelRequested,
    DomainError,
    InternalJobError,
    LeaseLost,
    ReleaseRequested,
    TimedOut,
    UnknownKind,
)
from models.jobs import store
from models.jobs.context import JobContext
from models.jobs.records import LeasedJob
from models.kinds import get_kind, load_kinds
from models.ops import counters
from models.settings import get_settings
from models.tenancy.access import check_allowed, find_membership
from tasks import shutdown, worker_db
from tasks.presence import STATS

log = logging.getLogger("spacestore.runner")

Publish = Callable[..., None]


_CONTROLS_TTL = 1.0  # a pause or a new limit reaches every worker within this many seconds
_controls_cache: tuple[float, list[Any]] | None = None


def _controls(conn: Any) -> list[Any]:
    """Operator controls, re-read at most once a second per process (not once per claim)."""
    global _controls_cache
    now = time.monotonic()
    cache = _controls_cache
    if cache is None or now - cache[0] > _CONTROLS_TTL:
        _controls_cache = (now, store.claim_controls(conn))
    return _controls_cache[1]


def drain(*, publish_wake: Publish | None = None, limit: int | None = None) -> int:
    """Claim and run due jobs one after another, at most ``limit``; returns how many ran."""
    load_kinds()
    shutdown.install_in_pool_child()
    engine = worker_db.engine()
    worker = worker_db.worker_name()
    ran = 0
    for _ in range(limit if limit is not None else get_settings().drain_limit):
        if shutdown.stop_requested():
            break
        with transaction(engine, actor=f"worker:{worker}") as conn:
            leased = store.claim(conn, worker, controls=_controls(conn))
        if leased is None:
            break
        run_one(leased, publish_wake=publish_wake)
        ran += 1
    return ran


def run_one(leased: LeasedJob, *, publish_wake: Publish | None = None) -> str:
    """Run one leased job to a fenced end. Returns what happened, for logs and tests."""
    engine = worker_db.engine()
    worker = worker_db.worker_name()
    actor = f"worker:{worker}"
    context = {"job_id": str(leased.id), "kind": leased.kind,
               "organization_id": str(leased.organization_id), "attempt": leased.attempt,
               "request_id": leased.request_id}
    try:
        kind = get_kind(leased.kind)
    except UnknownKind as error:
        # A worker without this kind's code (e.g. mid-deploy) fails it permanently and says so.
        return _record_failure(engine, leased, error, actor=actor, context=context)

    started = time.monotonic()
    rules = kind.rules
    ctx = JobContext(engine, leased, rules, actor=actor,
                     deadline=started + rules.time_limit if rules.time_limit else None,
                     should_release=shutdown.release_due)
    heartbeat = _Heartbeat(ctx, interval=max(0.2, leased.lease_seconds / 3),
                           kill_at=started + rules.hard_time_limit if rules.hard_time_limit else None)
    heartbeat.start()
    STATS.running = 1
    outcome = "crashed"  # what stays if even recording the failure raises (database gone)
    try:
        params = kind.parse_params(leased.params)
        result = kind.run(ctx, params)
        outcome = _finish(ctx, result)
    except LeaseLost:
        outcome = "lease_lost"
        log.warning("job stopped: lease lost to a newer attempt", extra=context)
    except ReleaseRequested:
        with transaction(engine, actor=actor) as conn:
            released = store.release(conn, leased.id, leased.lease_token)
        outcome = "released" if released else "lease_lost"
        log.info("job given back at shutdown; attempt not counted", extra=context)
        if released and publish_wake is not None:
            _publish_quietly(publish_wake, str(leased.id), countdown=None)
    except CancelRequested:
        with transaction(engine, actor=actor) as conn:
            ok = store.acknowledge_cancel(conn, leased.id, leased.lease_token)
        outcome = "cancelled" if ok else "lease_lost"
        log.info("job cancelled at a safe point", extra=context)
    except DomainError as error:
        outcome = _record_failure(engine, leased, error, actor=actor, context=context,
                                  kind_rules=kind.rules, publish_wake=publish_wake)
    except Exception as exc:
        outcome = _record_failure(engine, leased, InternalJobError(), actor=actor, context=context,
                                  kind_rules=kind.rules, publish_wake=publish_wake, exc=exc)
    finally:
        heartbeat.stop()
        STATS.running = 0
        STATS.processed += 1
        if outcome not in ("completed", "cancelled", "released"):
            STATS.failed += 1
    log.info("job attempt ended: %s in %.3fs", outcome, time.monotonic() - started, extra=context)
    return outcome


def _finish(ctx: JobContext, result: dict[str, Any]) -> str:
    """ONE transaction: re-check the requester and the organization, then the fenced UPDATE."""
    job = ctx.job
    with transaction(ctx.engine, organization_id=job.organization_id, actor=ctx.actor) as conn:
        membership = find_membership(conn, job.organization_id, job.requested_by)
        check_allowed(membership, org_states=ctx.rules.org_states, role=ctx.rules.role,
                      for_worker=True)
        if store.complete(conn, job.id, job.lease_token, result):
            return "completed"
    worker_db.COUNTERS.add(counters.STALE_FINISHES, job.kind)
    log.warning("stale finish discarded: a newer attempt owns the job",
                extra={"job_id": str(job.id), "kind": job.kind, "attempt": job.attempt,
                       "organization_id": str(job.organization_id)})
    return "stale_finish_discarded"


def _record_failure(
    engine: Any,
    leased: LeasedJob,
    error: DomainError,
    *,
    actor: str,
    context: dict[str, Any],
    kind_rules: Any = None,
    publish_wake: Publish | None = None,
    exc: BaseException | None = None,
) -> str:
    retry_in = kind_rules.backoff(leased.attempt) if kind_rules else 0.0
    with transaction(engine, actor=actor) as conn:
        status = store.fail_attempt(conn, leased.id, leased.lease_token, error, retry_in=retry_in)
        if status is not None and exc is not None:
            # The technical detail goes to operators only, never into error_message.
            store.record_diagnostics(
                conn, leased, worker=worker_db.worker_name(),
                exception_class=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback="".join(traceback.format_exception(exc)),
            )
    if status is None:
        log.warning("failure of a stale attempt discarded", extra=context)
        return "lease_lost"
    log.info("job attempt failed with %s; now %s", error.code, status, extra=context)
    if status == "queued" and publish_wake is not None:
        _publish_quietly(publish_wake, str(leased.id), countdown=retry_in)
    return "retry" if status == "queued" else status


def _publish_quietly(publish_wake: Publish, job_id: str, *, countdown: float | None) -> None:
    try:
        publish_wake(job_id, countdown=countdown)
    except Exception:
        log.warning("wake-up not published; the sweeper will re-send it", extra={"job_id": job_id})


class _Heartbeat:
    """Extends the lease every ``interval`` seconds while the token matches.

    When an extension touches no row the lease is lost: the job learns it at its next
    checkpoint, and its writes and finish are fenced in any case. Past the kind's hard time
    limit it records the timeout and kills the process: a job that never reaches a checkpoint
    cannot be stopped any other way, and Celery replaces the pool process.
    """

    def __init__(self, ctx: JobContext, *, interval: float, kill_at: float | None = None) -> None:
        self._ctx = ctx
        self._interval = interval
        self._kill_at = kill_at
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._kill_at is not None and time.monotonic() > self._kill_at:
                self._hard_kill()
            try:
                self._ctx.heartbeat()
            except Exception:
                log.warning("lease heartbeat failed; will retry", extra={"job_id": str(self._ctx.job.id)})
            if self._ctx.lease_lost:
                return

    def _hard_kill(self) -> None:
        job = self._ctx.job
        error = TimedOut(permanent=not self._ctx.rules.retry_on_timeout)
        log.error("job exceeded its hard time limit; killing its worker process",
                  extra={"job_id": str(job.id), "kind": job.kind, "attempt": job.attempt,
                         "organization_id": str(job.organization_id)})
        try:
            with transaction(self._ctx.engine, actor=self._ctx.actor) as conn:
                store.fail_attempt(conn, job.id, job.lease_token, error,
                                  retry_in=self._ctx.rules.backoff(job.attempt))
        finally:
            # If that write failed, the lease simply expires and the sweeper applies the rules.
            os.kill(os.getpid(), signal.SIGKILL)
