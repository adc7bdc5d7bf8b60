"""Plain Celery on Celery's own defaults, with one no-op task: the baseline Space Jobs is
measured against.

Nothing here changes a Celery setting except the broker URL and the queue's name: prefork pool,
prefetch multiplier 4, acknowledgement on receipt, no task events, no result backend, JSON,
the worker's default log level (WARNING). The task keeps its own bookkeeping in Redis, one
round trip per task, so the figures are read from Redis the way Space Jobs' are read from its
rows, never from worker logs.

The worker side of this module is configured through the environment (``REDIS_URL``,
``PLAIN_BENCH_QUEUE``, ``PLAIN_BENCH_READY_KEY``); the benchmark side is :class:`PlainCelery`.
"""

from __future__ import annotations

import os
import time
from typing import Any, ClassVar

import celery
import redis
from celery import Celery
from celery.signals import worker_ready

from bench.harness import paced
from bench.peers.base import Figure, Peer, PeerError, drain_timeout, latency_figure, rate_figure

NOOP_TASK = "plain_bench.noop"

app = Celery("plain-bench", set_as_current=False)
app.conf.broker_url = os.environ.get("REDIS_URL")
app.conf.task_default_queue = os.environ.get("PLAIN_BENCH_QUEUE", "plain-bench")

_client: redis.Redis | None = None
_client_pid: int | None = None


def redis_py_url(url: str) -> str:
    """redis-py spells kombu's unix-socket URL (the embedded Redis) ``unix://``."""
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://"):]
    return url


def redis_client() -> redis.Redis:
    """One client per process: a prefork child must not share its parent's socket."""
    global _client, _client_pid
    if _client is None or _client_pid != os.getpid():
        _client = redis.Redis.from_url(redis_py_url(os.environ.get("REDIS_URL") or app.conf.broker_url))
        _client_pid = os.getpid()
    return _client


def configure(broker_url: str, queue: str) -> None:
    """Point the publishing side (the benchmark process) at the run's Redis and queue."""
    app.conf.broker_url = broker_url
    app.conf.task_default_queue = queue


@worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    # The benchmark waits for this key rather than for a log line: at Celery's default log
    # level (WARNING) the worker logs nothing when it is ready.
    if key := os.environ.get("PLAIN_BENCH_READY_KEY"):
        redis_client().rpush(key, getattr(sender, "hostname", "?"))


@app.task(name=NOOP_TASK)
def noop(key: str, total: int | None = None, sent_at: float | None = None) -> None:
    """Record when a drain started and ended, or how late a paced task ended."""
    client = redis_client()
    if total is not None:
        # One round trip: the first task marks the start, every task counts itself.
        _first, count = client.pipeline(transaction=False).set(
            f"{key}:first", time.time(), nx=True).incr(f"{key}:count").execute()
        if count == total:
            client.set(f"{key}:last", time.time())
    if sent_at is not None:
        client.rpush(f"{key}:latency", time.time() - sent_at)


class PlainCelery(Peer):
    name = "celery"
    title = f"plain Celery {celery.__version__}"
    defaults: ClassVar[str] = (
        "`celery worker -c P` (prefork, P pool processes), Celery defaults: prefetch multiplier 4,"
        " acks on receipt, no task events, no result backend, JSON, log level WARNING; Redis broker;"
        " one producer calling noop.delay()")

    def _prepare(self, admin_url: str, redis_url: str) -> None:
        self.redis_url = redis_url
        self.queue = f"peer-celery-{self.run_id}"
        self.prefix = f"peer-celery:{self.run_id}"
        self.redis = redis.Redis.from_url(redis_py_url(redis_url))
        configure(redis_url, self.queue)

    def _queued(self) -> int:
        return self.redis.llen(self.queue)

    def _purge(self) -> None:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(self.queue)
        if keys := list(self.redis.scan_iter(f"{self.prefix}:*")):
            self.redis.delete(*keys)

    def _start(self, processes: int) -> None:
        ready_key = f"{self.prefix}:ready"
        self.workers.start(self.name, ["-m", "celery", "-A", "bench.peers.plain_celery", "worker",
                                       "-c", str(processes), "-n", f"{self.queue}@%h"],
                           {"REDIS_URL": self.redis_url, "PLAIN_BENCH_QUEUE": self.queue,
                            "PLAIN_BENCH_READY_KEY": ready_key})
        self.wait_until("worker ready", lambda: self.redis.llen(ready_key) >= 1, timeout=60)

    def enqueue_rate(self, n: int) -> Figure:
        self._purge()
        key = f"{self.prefix}:enqueue"
        started = time.perf_counter()
        for _ in range(n):
            noop.delay(key=key, total=n)
        seconds = time.perf_counter() - started
        if (queued := self._queued()) != n:
            raise PeerError(f"plain Celery: {queued} messages in the queue after {n} publishes")
        self._purge()
        return rate_figure(n, seconds, f"noop.delay() one by one, no worker; {n} messages in the list")

    def drain_rate(self, n: int, processes: int = 2) -> Figure:
        self._purge()
        key = f"{self.prefix}:drain"
        with app.producer_or_acquire() as producer:
            for _ in range(n):
                noop.apply_async(kwargs={"key": key, "total": n}, producer=producer)
        if (queued := self._queued()) != n:
            raise PeerError(f"plain Celery: {queued} messages queued of {n}")
        self._start(processes)
        try:
            self.wait_until(f"{n} tasks done", lambda: self.redis.exists(f"{key}:last"), drain_timeout(n))
            time.sleep(0.5)  # a duplicate delivery would show up as a count above n
            first, last, count = self.redis.mget(f"{key}:first", f"{key}:last", f"{key}:count")
            queued = self._queued()
        finally:
            self.workers.stop_all()
        if int(count) != n or queued:
            raise PeerError(f"plain Celery drain: {int(count)} task runs for {n} tasks, {queued} left")
        self._purge()
        return rate_figure(n, float(last) - float(first),
                           f"{processes} prefork processes, first task start -> last task end (Redis"
                           f" SET NX / INCR in the task); {n} runs counted, queue empty")

    def latency(self, rate: float = 50, seconds: float = 20, processes: int = 2) -> Figure:
        self._purge()
        key = f"{self.prefix}:latency"
        count = max(2, round(rate * seconds))
        self._start(processes)
        try:
            elapsed = paced(rate, count, lambda: noop.delay(key=key, sent_at=time.time()))
            self.wait_until(f"{count} latency tasks", lambda: self.redis.llen(f"{key}:latency") >= count,
                            timeout=60)
            time.sleep(0.5)
            values = [float(v) for v in self.redis.lrange(f"{key}:latency", 0, -1)]
        finally:
            self.workers.stop_all()
        if len(values) != count:
            raise PeerError(f"plain Celery latency: {len(values)} records for {count} tasks")
        self._purge()
        return latency_figure(values, f"noop.delay() at {count / elapsed:.1f}/s achieved, {processes}"
                              " prefork processes, publish -> end of the task body (RPUSH)")

    def _cleanup(self) -> None:
        if not hasattr(self, "redis"):
            return
        self._purge()
        self.redis.delete(f"_kombu.binding.{self.queue}", f"_kombu.binding_permanent.{self.queue}")
        app.pool.force_close_all()
