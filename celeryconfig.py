"""Celery settings, decided here and fed from the one settings object (models.settings; see
docs/reference/configuration.md).

Redis only carries wake-up signals; the job row in PostgreSQL is the truth. That decides most
of what follows.
"""

from spacejobs.models.settings import get_settings

_settings = get_settings()

broker_url = _settings.redis_url
broker_connection_retry_on_startup = True
# Forever, not Celery's 100 tries: a worker that gave up on Redis would take its pool, and so
# the jobs its pool processes run from PostgreSQL alone (tasks/floor.py), down with it.
broker_connection_max_retries = None
broker_connection_timeout = _settings.broker_timeout
broker_transport_options = {
    "socket_timeout": _settings.broker_timeout,
    "socket_connect_timeout": _settings.broker_timeout,
}

# A message is a nudge, not the job: acknowledge it on receipt (acks_late off). Redelivering a
# wake-up after a worker crash would add nothing, because the crashed attempt still holds the
# lease; recovery comes from lease expiry and beat's re-signals instead. Late acks on
# Redis would also bring the visibility-timeout redelivery storm without any benefit here.
task_acks_late = False
task_reject_on_worker_lost = False
# One message at a time per process: each wake-up drains up to SPACEJOBS_DRAIN_LIMIT jobs itself.
worker_prefetch_multiplier = 1

task_serializer = "json"
accept_content = ["json"]
result_serializer = "json"
task_ignore_result = True
result_backend = None

# Flower and `celery events` see the wake-ups; the job rows are the real history. The
# "task-sent" event costs every submit a second publish (~0.5 ms measured), so it is opt-in.
worker_send_task_events = _settings.task_events
task_send_sent_event = _settings.task_sent_events

# Remote control is a mailbox every worker listens to on the broker: anyone who can publish to
# Redis could send `shutdown`, `pool_shrink` or `rate_limit` to every worker. Off unless an
# operator opts in (SPACEJOBS_REMOTE_CONTROL=1); task events, which Flower and `celery events`
# read, are separate and stay on.
worker_enable_remote_control = _settings.remote_control
# Celery's consumer with one guard: wake-ups reserved on a lost broker connection are not put
# back, which is where a Redis restart used to kill the worker (tasks/consumer.py).
worker_consumer = "spacejobs.tasks.consumer:WakeupConsumer"
# Only acks_late tasks are cancelled on a connection loss, and there are none: Celery 6's
# default, set now so that every reconnect does not log a deprecation warning.
worker_cancel_long_running_tasks_on_connection_loss = True

task_default_queue = _settings.queue
# A sweep asked for on demand (`celery call spacejobs.sweep`) gets a queue of its own, which
# workers read alongside the wake-ups (the Redis transport alternates between a consumer's
# queues): behind a backlog of wake-ups in one queue it would otherwise wait (or expire).
task_routes = {"spacejobs.sweep": {"queue": _settings.sweep_queue}}
worker_hijack_root_logger = False
worker_concurrency = _settings.worker_concurrency
timezone = "UTC"

# Beat runs the maintenance chores itself (tasks/beat.py, tasks/maintenance/), each on its own
# cadence: a chore recovers lost wake-ups and expired leases, so it must never wait for a pool
# process behind a backlog of jobs. No entry of Celery's own schedule is needed for them.
beat_scheduler = "spacejobs.tasks.beat:MaintenanceScheduler"
