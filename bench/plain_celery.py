"""Moved to :mod:`bench.peers.plain_celery`, which runs plain Celery on Celery's own defaults
(this module used to load the project's ``celeryconfig``: prefetch 1, task events on).

Kept as an alias only so that ``bench.throughput`` (and ``celery -A bench.plain_celery``) work
until the harness calls the peer drivers; then delete it.
"""

from bench.peers.plain_celery import NOOP_TASK, app, configure, noop, redis_client, redis_py_url

__all__ = ["NOOP_TASK", "app", "configure", "noop", "redis_client", "redis_py_url"]
