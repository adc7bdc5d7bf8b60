"""The Redis side of a stack: what is waiting in a queue, and removing a queue when done.

Celery (kombu) and redis-py spell a unix-socket Redis differently; the embedded and private
servers listen on one, so every direct look at Redis goes through ``redis_client``.
"""

from __future__ import annotations

import redis
from kombu import Connection as KombuConnection

KOMBU_SOCKET = "redis+socket://"


def redis_py_url(url: str) -> str:
    """redis-py's spelling of a kombu broker URL (``redis+socket://path`` is ``unix://path``)."""
    if url.startswith(KOMBU_SOCKET):
        return "unix://" + url[len(KOMBU_SOCKET):]
    return url


def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_py_url(url))


def queue_length(url: str, queue: str) -> int:
    """Messages waiting in ``queue`` (wake-ups nobody has taken yet)."""
    return int(redis_client(url).llen(queue))


def purge_queue(url: str, queue: str) -> int:
    """Drop every message waiting in ``queue``; returns how many there were."""
    with KombuConnection(url) as conn:
        return conn.default_channel.queue_purge(queue) or 0


def forget_queues(url: str, *queues: str) -> None:
    """Purge the queues and remove the bindings kombu keeps for them, so that a shared Redis
    is left as it was found."""
    for queue in queues:
        purge_queue(url, queue)
    redis_client(url).delete(*(f"_kombu.{kind}.{queue}" for kind in ("binding", "binding_permanent")
                               for queue in queues))
