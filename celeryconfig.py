"""Celery settings, every one read from the environment (see README, "Configuration").

Redis only carries wake-up signals; the job row in PostgreSQL is the truth. That decides most
of what follows.
"""

import os

broker_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
broker_connection_retry_on_startup = True
broker_connection_timeout = float(os.environ.get("SPACEJOBS_BROKER_TIMEOUT", "2"))
broker_transport_options = {
    "socket_timeout": float(os.environ.get("SPACEJOBS_BROKER_TIMEOUT", "2")),
    "socket_connect_timeout": float(os.environ.get("SPACEJOBS_BROKER_TIMEOUT", "2")),
}

# A message is a nudge, not the job: acknowledge it on receipt (acks_late off). Redelivering a
# wake-up after a worker crash would add nothing, because the crashed attempt still holds the
# lease; recovery comes from lease expiry and the sweeper's re-signal instead. Late acks on
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
worker_send_task_events = os.environ.get("SPACEJOBS_TASK_EVENTS", "1") == "1"
task_send_sent_event = os.environ.get("SPACEJOBS_TASK_SENT_EVENTS", "0") == "1"

task_default_queue = os.environ.get("SPACEJOBS_QUEUE", "spacejobs")
# Sweeps get a queue of their own, which workers read alongside the wake-ups (the Redis
# transport alternates between a consumer's queues): behind a backlog of wake-ups in one queue
# they would otherwise wait (or expire), and expired leases would wait with them.
sweep_queue = task_default_queue + ".sweep"
task_routes = {"spacejobs.sweep": {"queue": sweep_queue}}
worker_hijack_root_logger = False
worker_concurrency = int(os.environ.get("SPACEJOBS_WORKER_CONCURRENCY", "2"))
timezone = "UTC"

beat_schedule = {
    "spacejobs-sweep": {
        "task": "spacejobs.sweep",
        "schedule": float(os.environ.get("SPACEJOBS_SWEEP_INTERVAL", "5")),
        # A sweep that could not run in time is superseded by the next one.
        "options": {"expires": float(os.environ.get("SPACEJOBS_SWEEP_INTERVAL", "5"))},
    },
}
