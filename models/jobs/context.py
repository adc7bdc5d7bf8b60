"""What a running job sees: its leased row, tenant-scoped transactions, progress, checkpoints."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine

from models.db.transaction import transaction
from models.errors import CancelRequested, LeaseLost, ReleaseRequested, TimedOut
from models.jobs import store
from models.jobs.records import LeasedJob, Status
from models.kinds.rules import KindRules
from models.tenancy.access import check_allowed, find_membership
from models.tenancy.projects import Projects


class Tenant:
    """Repositories bound to one tenant-scoped transaction."""

    def __init__(self, conn: Connection, organization_id: UUID) -> None:
        self.conn = conn
        self.projects = Projects(conn, organization_id)


class JobContext:
    def __init__(
        self,
        engine: Engine,
        job: LeasedJob,
        rules: KindRules,
        *,
        actor: str,
        deadline: float | None = None,
        should_release: Callable[[], bool] | None = None,
    ) -> None:
        self.engine = engine
        self.job = job
        self.rules = rules
        self.actor = actor
        self.deadline = deadline  # time.monotonic() value of the soft time limit
        # Asked by the worker's shutdown: True once the grace period for running jobs is over.
        self._should_release = should_release or (lambda: False)
        self._lost = threading.Event()
        self._cancel = threading.Event()

    @contextmanager
    def tenant(self) -> Iterator[Tenant]:
        """A NEW transaction scoped to the job's organization (taken from the leased row).

        It first re-reads the requester's membership and the organization's state, and before
        committing it locks the job row with our lease token: tenant writes commit only while
        this attempt still holds the job.
        """
        self.checkpoint()
        with transaction(
            self.engine, organization_id=self.job.organization_id, actor=self.actor
        ) as conn:
            membership = find_membership(conn, self.job.organization_id, self.job.requested_by)
            check_allowed(
                membership, org_states=self.rules.org_states, role=self.rules.role, for_worker=True
            )
            yield Tenant(conn, self.job.organization_id)
            if not store.lock_lease(conn, self.job.id, self.job.lease_token):
                self._lost.set()
                raise LeaseLost()

    def progress(self, stage: str, *, done: int | None = None, total: int | None = None) -> None:
        """Record a measured stage; a progress write that finds no lease means the lease is lost."""
        value: dict[str, Any] = {"stage": stage}
        if done is not None:
            value["done"] = done
        if total is not None:
            value["total"] = total
        with transaction(self.engine, actor=self.actor) as conn:
            status = store.record_progress(conn, self.job.id, self.job.lease_token, json.dumps(value))
        self._note(status)
        self.checkpoint()

    def checkpoint(self) -> None:
        """A safe point: stop here if the lease is lost, a cancel was asked for, time is up, or
        the worker is shutting down and may wait no longer."""
        if self._lost.is_set():
            raise LeaseLost()
        if self._cancel.is_set():
            raise CancelRequested()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimedOut(permanent=not self.rules.retry_on_timeout)
        if self._should_release():
            raise ReleaseRequested()

    def check_lease_now(self) -> None:
        """Checkpoint after asking the database (the heartbeat does this in the background)."""
        with transaction(self.engine, actor=self.actor) as conn:
            self._note(store.lease_status(conn, self.job.id, self.job.lease_token))
        self.checkpoint()

    def _note(self, status: str | None) -> None:
        if status is None:
            self._lost.set()
        elif status == Status.CANCEL_REQUESTED:
            self._cancel.set()

    # Called by the heartbeat thread.
    def heartbeat(self) -> None:
        with transaction(self.engine, actor=self.actor) as conn:
            self._note(store.extend_lease(conn, self.job.id, self.job.lease_token))

    @property
    def lease_lost(self) -> bool:
        return self._lost.is_set()
