"""The job API for application code outside the web and the workers (a script, a notebook, a
management command): one call builds it from the settings, wake-ups included::

    from spacejobs.tasks.client import connect

    jobs = connect()
    with jobs.engine.begin() as conn:
        submitted = jobs.submit(conn, "projects_export", organization_id=org, requested_by=user)
    outcome = jobs.wait(submitted.job.id, timeout=30, organization_id=org)

It lives in ``tasks/`` because the wake-up publisher does: a submit's wake-up is a Celery
message (sent by name, tasks.wakeups), and ``models/`` knows nothing of Celery.
"""

from __future__ import annotations

from spacejobs.models.db.engine import make_engine
from spacejobs.models.db.roles import APP_ROLE, OPERATOR_ROLE, role_url
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.ops.counters import BufferedCounters
from spacejobs.models.settings import Settings, get_settings
from spacejobs.tasks.wakeups import WakeupPublisher


def connect(settings: Settings | None = None, *, pool_size: int = 2) -> Jobs:
    """The job API, from the settings (``DATABASE_URL``, ``REDIS_URL``, the kind modules).

    It registers the settings' kinds, opens nothing until first used, acts as the web role
    (space_app), and sends each submit's wake-up once its transaction commits, so a worker
    starts the job at once. Call it once per process and keep what it returns."""
    settings = settings or get_settings()
    load_kinds(settings.kind_module_names)
    engine = make_engine(role_url(APP_ROLE), pool_size=pool_size,
                         application_name="spacejobs-script")
    operator_engine = make_engine(role_url(OPERATOR_ROLE), pool_size=1,
                                  application_name="spacejobs-script-ops")
    publisher = WakeupPublisher(settings.redis_url, settings.queue,
                                counters=BufferedCounters(lambda: engine))
    return Jobs(engine, wake=publisher.wake, operator_engine=operator_engine)
