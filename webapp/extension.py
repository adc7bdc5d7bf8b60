"""The Flask extension an application adds Space Jobs with, in the ecosystem's shape::

    from flask_sqlalchemy import SQLAlchemy
    import spacejobs

    db = SQLAlchemy()
    jobs = spacejobs.SpaceJobs()

    def create_app():
        app = Flask(__name__)
        app.config.from_prefixed_env()          # SPACEJOBS_*, DATABASE_URL, REDIS_URL as the environment
        db.init_app(app)
        jobs.init_app(app, db=db)                # submits join db.session's transaction
        return app

    @app.post("/thumbnails")
    def make_thumbnail():
        photo = Photo(...)
        db.session.add(photo)
        submitted = jobs.submit(db.session, "thumbs.make", {"photo_id": photo.id},
                                organization_id=team_org, requested_by=user_id)
        db.session.commit()                      # the photo and its job, or neither
        return {"job_id": str(submitted.job.id)}, 202   # the wake-up went out after COMMIT

Settings come from ``app.config`` under the names of the environment (``SPACEJOBS_QUEUE``,
``REDIS_URL``, …; docs/reference/configuration.md), over the environment's own. A submit runs in
the application's own transaction, on the application's own engine and database role, which
needs ``GRANT space_app TO <role>`` (and ``space_tenancy`` to write its tenants: :attr:`tenancy`);
a missing grant is a :class:`~spacejobs.models.tenancy.api.MissingGrant` that says which. The
wake-up is sent once that transaction commits; a rollback leaves no job and sends nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, Unpack
from uuid import UUID

from flask import Flask
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from spacejobs.models.db.engine import make_engine, prepare_engine
from spacejobs.models.db.roles import APP_ROLE, role_url
from spacejobs.models.jobs import canvas
from spacejobs.models.jobs.service import Jobs, SubmitOptions, Submitted
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import configure
from spacejobs.models.tenancy.access import Membership
from spacejobs.models.tenancy.api import HasConnection, MissingGrant, Tenancy, connection_of
from spacejobs.tasks.wakeups import WakeupPublisher

#: the role an application's database role must hold to submit and read jobs
JOBS_ROLE = APP_ROLE


class HasEngine(Protocol):
    """Flask-SQLAlchemy's extension (``db``): its engine, in an application context."""

    @property
    def engine(self) -> Engine: ...


class SpaceJobs:
    """Space Jobs in a Flask application: ``SpaceJobs(app, db=db)``, or ``SpaceJobs()`` and
    later ``init_app(app, db=db)``. ``db`` (Flask-SQLAlchemy) or ``engine`` is the application's
    own database: submits join its transactions. Without either, Space Jobs opens its own engine
    as ``space_app`` (from ``DATABASE_URL``), and a submit joins a connection of it."""

    def __init__(self, app: Flask | None = None, *, db: HasEngine | None = None,
                 engine: Engine | None = None) -> None:
        self._jobs: Jobs | None = None
        self._engine_of: Callable[[], Engine] | None = None
        self._publisher: WakeupPublisher | None = None
        self._lock = threading.Lock()
        if app is not None:
            self.init_app(app, db=db, engine=engine)

    def init_app(self, app: Flask, *, db: HasEngine | None = None,
                 engine: Engine | None = None) -> None:
        """Read the settings from ``app.config`` (over the environment), register the kinds
        they name, and make ready to submit through the application's own engine."""
        settings = configure(app.config)
        load_kinds(settings.kind_module_names)
        self._publisher = WakeupPublisher(settings.redis_url, settings.queue)
        if engine is not None:
            prepare_engine(engine)
            self._engine_of = lambda: engine
        elif db is not None:
            # Flask-SQLAlchemy made its engine in its own init_app, reachable in an app context:
            # prepared now, before the application's first connection, so that every
            # connection of its pool can send a wake-up after its transaction commits.
            with app.app_context():
                prepare_engine(db.engine)
            self._engine_of = lambda: db.engine
        else:
            own = make_engine(role_url(APP_ROLE), pool_size=2, application_name="spacejobs-app")
            self._engine_of = lambda: own
        app.extensions["spacejobs"] = self

    @property
    def jobs(self) -> Jobs:
        """The job API (spacejobs.Jobs) on the application's engine: reads, cancels, signals,
        results and waits, in the caller's transaction (``connection_of(db.session)``) or its
        own (``jobs.transaction(org, user)``)."""
        with self._lock:
            if self._jobs is None:
                if self._engine_of is None or self._publisher is None:
                    raise RuntimeError("SpaceJobs is not initialised: call init_app(app) first")
                publisher = self._publisher
                self._jobs = Jobs(prepare_engine(self._engine_of()), wake=publisher.wake)
            return self._jobs

    def submit(self, session: Connection | HasConnection, kind: str,
               params: dict[str, Any] | None = None, *, organization_id: UUID,
               requested_by: UUID, **options: Unpack[SubmitOptions]) -> Submitted:
        """Queue a job in the application's transaction (a Session's, or a Connection's of the
        application's engine); the wake-up goes out after it commits, nothing if it rolls
        back. Options and errors as :meth:`spacejobs.Jobs.submit`."""
        conn = connection_of(session)
        with _grant_needed(JOBS_ROLE):
            return self.jobs.submit(conn, kind, params, organization_id=organization_id,
                                    requested_by=requested_by, **options)

    def submit_workflow(self, session: Connection | HasConnection, workflow: canvas.Canvas, *,
                        organization_id: UUID, requested_by: UUID,
                        policy: canvas.Policy = "fail_fast",
                        idempotency_key: str | None = None) -> Submitted:
        """Queue a workflow (``chain``, ``group``, ``chord``, ``graph`` of ``sig``) as one job,
        in the application's transaction, as :meth:`submit` does."""
        conn = connection_of(session)
        with _grant_needed(JOBS_ROLE):
            return self.jobs.submit_workflow(conn, workflow, organization_id=organization_id,
                                             requested_by=requested_by, policy=policy,
                                             idempotency_key=idempotency_key)

    def member(self, session: Connection | HasConnection, organization_id: UUID,
               user_id: UUID) -> Membership:
        """Scope the application's transaction to the organization and user, and read the
        user's current membership (what :attr:`jobs`' reads of a member take)."""
        conn = connection_of(session)
        with _grant_needed(JOBS_ROLE):
            return self.jobs.member(conn, organization_id, user_id)

    def tenancy(self, session: Connection | HasConnection) -> Tenancy:
        """The application's organizations, users and memberships, written in its transaction
        (spacejobs.Tenancy)."""
        return Tenancy(session)


@contextmanager
def _grant_needed(role: str) -> Iterator[None]:
    """Turn PostgreSQL's ``permission denied`` into the GRANT the application's role lacks."""
    try:
        yield
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) == "42501":  # insufficient_privilege
            raise MissingGrant(
                f"The application's database role may not use Space Jobs: run GRANT {role} TO "
                "<the role of its database URL> (docs/guides/adding-to-your-flask-app.md)."
            ) from None
        raise
