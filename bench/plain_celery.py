"""A plain Celery app with one no-op task: the baseline that ``bench.throughput`` compares Space
Jobs against, on the same Redis and with the same Celery settings (``celeryconfig.py``).

The task does its own bookkeeping in Redis, so the benchmark reads what happened from Redis,
the way it reads Space Jobs from the database, rather than from the workers' logs.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from tests.kit.broker import redis_py_url

NOOP_TASK = "plain_bench.noop"

app = Celery("plain-bench", set_as_current=False)
# Same prefetch, acknowledgement, serializer and event settings as the Space Jobs workers, so the
# ratio measures the job store, not a difference in Celery configuration.
app.config_from_object("celeryconfig")
app.conf.task_default_queue = os.environ.get("PLAIN_BENCH_QUEUE", "plain-bench")
app.conf.beat_schedule = {}

_client: redis.Redis | None = None
_client_pid: int | None = None


def redis_client() -> redis.Redis:
    """One client per process: a prefork child must not share its parent's socket."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(redis_py_url(os.environ.get("REDIS_URL", app.conf.broker_url)))
        _client_pid = os.getpid()
    return _client


def configure(broker_url: str, queue: str) -> None:
    """Point the publishing side (the benchmark process) at the run's Redis and queue."""
    app.conf.broker_url = broker_url
    app.conf.task_default_queue = queue


@app.task(name=NOOP_TASK, ignore_result=True)
def noop(key: str, total: int | None = None, sent_at: float | None = None) -> None:
    """Record when the drain started and ended, or how late a paced task ran."""
    client = redis_client()
    if total is not None:
        # One round trip: the first task marks the start, every task counts itself.
        _first, count = client.pipeline(transaction=False).set(
            f"{key}:first", time.time(), nx=True).incr(f"{key}:count").execute()
        if count == total:
            client.set(f"{key}:last", time.time())
    if sent_at is not None:
        client.rpush(f"{key}:latency", time.time() - sent_at)
