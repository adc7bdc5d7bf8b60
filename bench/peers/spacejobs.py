"""Space Jobs itself, driven through the same interface as its peers, plus the figures only it
has to show: the web submit under `wrk`, a drain with many processes, the workers' memory, and
the cost of a claim behind a large history.

Everything runs on a stack of the test kit (tests/kit): a database cloned from the migrated
template, its own Celery queue, the application roles. Producers use the Python API
(``models.jobs.service``) as ``space_app``, one transaction per call, with the wake-up published
after COMMIT as the web does. Workers are what ``spacejobs worker --concurrency P`` runs (one
Celery worker, prefork, P pool processes; tests/kit ``celery_worker_argv``) on every default,
without beat. Every figure is read from the job rows and ``job_events`` as the owner role.
"""

from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import psutil
from sqlalchemy import text

from bench import rows
from bench.harness import (
    WRK_MISSING,
    WrkError,
    WrkReport,
    have_wrk,
    paced,
    percentile,
    poll,
    post_script,
    run_wrk,
)
from bench.peers.base import Figure, Peer, PeerError, drain_timeout, latency_figure, rate_figure
from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs import service, store
from spacejobs.models.jobs.service import Jobs
from spacejobs.models.kinds import load_kinds
from spacejobs.models.settings import reload_settings
from spacejobs.tasks.wakeups import guard_key
from tests.kit import broker
from tests.kit.processes import WORKER_READY, LoggedProcess, celery_worker_argv
from tests.kit.seeding import Tenant
from tests.kit.servers import Servers
from tests.kit.stack import Stack

KIND = "bench.noop"
Q = queries_beside(__file__)
# The web figure measures the submit path, not the rate limits that protect it.
UNLIMITED = "1000000000 per minute"
#: every request limit of the JSON API, by its app.config name (its setting is SPACEJOBS_ + it):
#: what the web benchmarks lift to UNLIMITED, counted still but never refusing
REQUEST_LIMITS = ("SUBMIT_RATE_LIMIT", "ORG_SUBMIT_RATE_LIMIT", "API_RATE_LIMIT", "POLL_RATE_LIMIT")


def _version() -> str:
    found = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[2]), "describe", "--always",
                            "--dirty"], capture_output=True, text=True, check=False)
    return found.stdout.strip() or "?"


def vm_rss_mb(pid: int) -> float:
    """Resident memory of one process in MB, as the kernel counts it (VmRSS, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise PeerError(f"no VmRSS for process {pid}")


@dataclass(frozen=True)
class ClaimCost:
    """One-job claims timed on a table holding ``finished`` finished and ``queued`` queued rows."""

    finished: int
    queued: int
    hit: Figure  # mean ms per claim that leased a job


class SpaceJobsPeer(Peer):
    name = "spacejobs"
    title = f"Space Jobs {_version()}"
    defaults: ClassVar[str] = (
        "one `celery -A spacejobs.tasks.celery_app worker --pool prefork -c P` (what `spacejobs worker"
        " --concurrency P` runs, less mingle and gossip; P pool processes under one consumer), every"
        " SPACEJOBS_* default (claim batch up to 100, drain limit 1000, linger 1 s, wake-ups coalesced"
        " over 1 s), no beat; producer: models.jobs.service.enqueue (one statement, its own"
        " transaction) / submit_many (one transaction per call) as space_app, wake-up after"
        " COMMIT; web: `spacejobs web --workers 2` (gunicorn gthread, 16 threads) with its submit"
        " rate limits lifted")

    stack: Stack | None = None
    servers: Servers | None = None

    def _prepare(self, admin_url: str, redis_url: str) -> None:
        # bench.noop exists only with this setting, in this process (the producer) and in the
        # stack's processes (Stack.env sets it for them).
        os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
        reload_settings()
        load_kinds()
        from spacejobs.tasks.wakeups import WakeupPublisher

        self.servers = Servers(admin_url, redis_url, "DATABASE_URL / REDIS_URL")
        self.stack = Stack(self.servers, self.log_dir, label="bench", process_settings={})
        self.tenant = self.stack.tenant("bench")
        self.publisher = WakeupPublisher(self.stack.redis_url, self.stack.queue)
        self.jobs = Jobs(self.stack.app_db, wake=self.publisher.wake)

    # -- helpers ---------------------------------------------------------------------------

    def _read(self, reader: Any, *args: Any) -> Any:
        """What ``reader`` (one of bench.rows') reads, as the owner role."""
        with self.stack.admin() as conn:
            return reader(conn, *args)

    def _clear(self) -> None:
        """Empty the tables, the wake-up queue and the coalescing guard, so that the next figure
        starts from nothing and its first submit publishes a wake-up."""
        with self.stack.admin() as conn:
            conn.execute(Q["clear"])
        broker.purge_queue(self.stack.redis_url, self.stack.queue)
        broker.redis_client(self.stack.redis_url).delete(guard_key(self.stack.queue))

    def _submit_one(self, tenant: Tenant) -> None:
        self.jobs.enqueue(KIND, organization_id=tenant.organization_id,
                          requested_by=tenant.user_id)

    def _submit_many(self, tenant: Tenant, n: int, batch: int) -> None:
        for offset in range(0, n, batch):
            with self.stack.app_db.begin() as conn:
                self.jobs.submit_many(conn, [service.JobRequest(KIND)] * min(batch, n - offset),
                                    organization_id=tenant.organization_id,
                                    requested_by=tenant.user_id)

    def _expect_queued(self, n: int) -> None:
        if (queued := self._read(rows.progress).queued) != n:
            raise PeerError(f"Space Jobs: {queued} jobs queued after submitting {n}")

    def _start_worker(self, processes: int) -> LoggedProcess:
        name = f"worker-{uuid.uuid4().hex[:6]}"
        return self.stack.processes.start(
            name, celery_worker_argv("spacejobs.tasks.celery_app", self.stack.queue, name, processes),
            self.stack.env(), ready=WORKER_READY, timeout=120)

    def _wait(self, what: str, done: Any, timeout: float, interval: float = 0.2) -> None:
        """Poll ``done`` until it holds; a dead process of the stack or the timeout raises."""
        if not poll(done, timeout, interval=interval, between=self.stack.processes.check_alive):
            logs = "\n".join(f"--- {p.name}\n{p.output()[-1500:]}" for p in self.stack.processes)
            raise PeerError(f"Space Jobs: {what} not reached after {timeout:.0f} s\n{logs}")

    def _wait_completed(self, n: int, timeout: float) -> None:
        self._wait(f"{n} jobs completed", lambda: self._read(rows.progress).completed >= n, timeout)
        time.sleep(0.5)  # a job run twice would show up as a second chain of events

    def _outcome(self, n: int) -> tuple[Any, Any, int]:
        """First lease and last completion; raises unless each of the ``n`` jobs ran once."""
        found = self._read(rows.outcome)
        if not (found.jobs == found.completed_once == found.clean_chains == n) or found.diagnostics:
            raise PeerError(f"Space Jobs: {found.jobs} rows, {found.completed_once} completed in one"
                            f" attempt, {found.clean_chains} event chains queued>leased>completed,"
                            f" {found.diagnostics} diagnostics, for {n} jobs")
        return found.first_leased, found.last_completed, len(found.claims_by_actor)

    # -- the peers' figures ----------------------------------------------------------------

    def enqueue_rate(self, n: int) -> Figure:
        return self._timed_enqueue(n, lambda: [self._submit_one(self.tenant) for _ in range(n)],
                                   "service.enqueue(): one statement, its own transaction, + wake-up")

    def bulk_enqueue_rate(self, n: int, batch: int = 1000) -> Figure:
        return self._timed_enqueue(n, lambda: self._submit_many(self.tenant, n, batch),
                                   f"service.submit_many() of {batch} per transaction")

    def _timed_enqueue(self, n: int, submit: Any, how: str) -> Figure:
        """``submit`` writes ``n`` jobs with no worker running; its time is the figure."""
        self._clear()
        started = time.perf_counter()
        submit()
        seconds = time.perf_counter() - started
        self._expect_queued(n)
        self._clear()
        return rate_figure(n, seconds, f"{how}, no worker; {n} rows queued")

    def drain_rate(self, n: int, processes: int = 2) -> Figure:
        (first, last, claimers), _ = self._drain(n, processes)
        return rate_figure(n, (last - first).total_seconds(),
                           f"1 worker -c {processes} ({processes} pool processes, {claimers} of them"
                           f" claimed), first lease -> last completion (job_events); {n} jobs"
                           " completed once")

    def cycle_rate(self, n: int, batch: int = 50, *, leases: bool = False) -> Figure:
        """The database's side of a drain, with no worker: ``n`` queued jobs leased and
        completed ``batch`` at a time by this one process, through the statements a worker runs
        (``store.claim_batch``, ``store.complete_batch`` as the worker role, under the worker's
        actor), each claim and each finish a transaction of its own. No Celery, no pool, no
        job's Python: for a change to the claim's or the finish's SQL, a figure with far less
        noise than the drain's. ``leases``: each batch also has its leases extended (the
        heartbeat's statement) and the requesters' standing read (the finish's), in a
        transaction between the two, and the figure says each statement's time a job (a
        transaction's commit counted with its last statement)."""
        self._clear()
        self._submit_many(self.tenant, n, 1000)
        self._expect_queued(n)
        with self.stack.admin() as conn:
            conn.execute(Q["analyze"])
        worker_db = self.stack.worker_db
        with transaction(worker_db) as conn:
            conn.execute(text("SELECT 1"))  # connected before the timing
        parts = ["claim", "heartbeat", "standing", "finish"] if leases else ["claim", "finish"]
        spent = dict.fromkeys(parts, 0.0)
        done = 0
        started = time.perf_counter()
        while done < n:
            marks = [time.perf_counter()]
            with transaction(worker_db, actor="worker:bench") as conn:
                leased = store.claim_batch(conn, "bench", limit=batch)
            marks.append(time.perf_counter())
            held = [(job.id, job.lease_token) for job in leased]
            if leases:
                with transaction(worker_db, actor="worker:bench") as conn:
                    extended = store.extend_leases(conn, held)
                    marks.append(time.perf_counter())
                    standing = store.lease_standing(conn, held)
                marks.append(time.perf_counter())
                if len(extended) != len(held) or len(standing) != len(held):
                    raise PeerError(f"Space Jobs cycle: {len(held)} leased, {len(extended)}"
                                    f" extended, {len(standing)} with a standing")
            with transaction(worker_db, actor="worker:bench") as conn:
                won = store.complete_batch(conn, [(job_id, token, {}, None)
                                                  for job_id, token in held])
            marks.append(time.perf_counter())
            for part, (before, after) in zip(parts, itertools.pairwise(marks), strict=True):
                spent[part] += after - before
            if not leased or len(won) != len(leased):
                raise PeerError(f"Space Jobs cycle: {len(leased)} leased, {len(won)} completed"
                                f" after {done} of {n}")
            done += len(won)
        seconds = time.perf_counter() - started
        self._clear()
        statements = ("store.claim_batch, extend_leases and lease_standing (one transaction)"
                      if leases else "store.claim_batch")
        each = ", ".join(f"{part} {1e6 * took / n:.1f}" for part, took in spent.items())
        return rate_figure(n, seconds, f"{statements} and store.complete_batch of {batch}, each"
                                       f" its own transaction, one process, no worker; µs a job:"
                                       f" {each}")

    def _drain(self, n: int, processes: int,
               inspect: Any = lambda worker: None) -> tuple[tuple[Any, Any, int], Any]:
        """Queue ``n`` jobs, let one worker drain them, check each ran once; returns the
        outcome and what ``inspect`` made of the worker before it was stopped."""
        self._clear()
        self._submit_many(self.tenant, n, 1000)
        self._expect_queued(n)
        worker = self._start_worker(processes)
        try:
            self._wait_completed(n, drain_timeout(n))
            outcome = self._outcome(n)
            seen = inspect(worker)
        finally:
            self.stack.processes.stop(worker)
        self._clear()
        return outcome, seen

    def latency(self, rate: float = 50, seconds: float = 20, processes: int = 2) -> Figure:
        self._clear()
        count = max(2, round(rate * seconds))
        worker = self._start_worker(processes)
        try:
            time.sleep(1)  # as for the peers: past the pool's start-up
            calls: list[float] = []

            def submit_timed() -> None:
                began = time.perf_counter()
                self._submit_one(self.tenant)
                calls.append(time.perf_counter() - began)

            elapsed = paced(rate, count, submit_timed)
            self._wait_completed(count, timeout=60)
            self._outcome(count)
            found = self._read(rows.event_latencies)
        finally:
            self.stack.processes.stop(worker)
        self._clear()
        if len(found) != count:
            raise PeerError(f"Space Jobs: {len(found)} complete histories for {count} jobs")
        hops = {"submit call (commit, wake-up)": calls,
                "created_at -> lease event": [started for _, started in found],
                "lease event -> completion event": [finished - started for finished, started in found]}
        breakdown = "; ".join(f"{hop} p50/p95 {1000 * percentile(values, 50):.1f}/"
                              f"{1000 * percentile(values, 95):.1f} ms"
                              for hop, values in hops.items())
        return latency_figure([finished for finished, _ in found],
                              f"service.enqueue() at {count / elapsed:.1f}/s achieved, 1 worker -c"
                              f" {processes}, created_at -> completion event (job_events); hops:"
                              f" {breakdown}")

    # -- Space Jobs' own figures -----------------------------------------------------------

    def fairness(self, flood: int = 10_000, processes: int = 2, lone_after: float = 0.25) -> Figure:
        """Issue 11's fairness bound: one organization's ``flood`` queued jobs drain, and
        ``lone_after`` seconds after the first lease another organization submits one job. The
        figure is that job's wait (created_at -> its lease event), beside the flood's drain rate
        and how many flood jobs were still unleased when it started, all from the rows."""
        self._clear()
        lone = self.stack.tenant(f"bench-lone-{uuid.uuid4().hex[:6]}")
        self._submit_many(self.tenant, flood, 1000)
        worker = self._start_worker(processes)
        try:
            self._wait("the flood's first lease", lambda: self._read(rows.leased_count) > 0,
                       timeout=120, interval=0.01)
            time.sleep(lone_after)
            self._submit_one(lone)
            self._wait_completed(flood + 1, drain_timeout(flood))
            row = self._read(rows.lone_wait, lone.organization_id)
        finally:
            self.stack.processes.stop(worker)
        self._clear()
        if not row["flood_left"]:
            raise PeerError("Space Jobs fairness: the flood had drained before the lone job was"
                            " leased; nothing was measured (a larger flood is needed)")
        rate = row["flood_jobs"] / float(row["flood_s"])
        wait_ms = 1000 * float(row["wait_s"])
        return Figure(wait_ms, "ms", f"the lone job of a second organization waited {wait_ms:.1f} ms"
                                     f" (created_at -> its lease event) while {row['flood_left']:,} of"
                                     f" a {flood:,}-job flood were still to be leased; the flood"
                                     f" drained at {rate:,.0f} jobs/s, 1 worker -c {processes}",
                      facts={"flood_rate": rate})

    def wait_latency(self, jobs: int = 200, processes: int = 2) -> Figure:
        """Issue 11's ``wait``: one job at a time, submitted then waited for with
        ``service.wait`` from this process; per job, from its completion event (written in the
        finishing statement just before COMMIT, whose NOTIFY wakes the waiter) to ``wait``
        returning. Both clocks are this machine's."""
        self._clear()
        worker = self._start_worker(processes)
        delays = []
        try:
            time.sleep(1)  # past the pool's start-up
            org, user = self.tenant.organization_id, self.tenant.user_id
            for _ in range(jobs):
                with self.stack.app_db.begin() as conn:
                    job = self.jobs.submit(conn, KIND, organization_id=org, requested_by=user).job
                outcome = self.jobs.wait(job.id, 30, organization_id=org)
                returned = datetime.now(UTC)
                if outcome.job.status != "completed":
                    raise PeerError(f"Space Jobs wait: a job ended {outcome.job.status}")
                delays.append((job.id, returned))
            done_at = self._read(rows.completion_times)
        finally:
            self.stack.processes.stop(worker)
        self._clear()
        return latency_figure([(returned - done_at[job_id]).total_seconds()
                               for job_id, returned in delays],
                              "service.wait() returning after the job's completion event, one job"
                              f" at a time, 1 worker -c {processes}")

    def web_rate(self, seconds: float = 10, connections: int = 32, processes: int = 2) -> Figure:
        """`POST /api/v1/orgs/{org}/jobs` through `spacejobs web` driven by wrk (keep-alive, one
        token), no worker running: jobs/s counted from the rows the POSTs created."""
        if not have_wrk():
            raise PeerError(f"the web figure {WRK_MISSING}")
        self._clear()
        web, base = self.stack.start_web(workers=processes,
                                         SPACEJOBS_SUBMIT_RATE_LIMIT=UNLIMITED,
                                         SPACEJOBS_ORG_SUBMIT_RATE_LIMIT=UNLIMITED)
        try:
            # The warm-up's rows belong to an organization of their own and are not counted.
            warm, measured = self.stack.tenant("bench-web-warm"), self.stack.tenant("bench-web")
            try:
                self._post(base, warm, 2, connections)
                report = self._post(base, measured, seconds, connections)
            except WrkError as error:
                raise PeerError(str(error)) from error
            time.sleep(0.5)  # requests wrk gave up on at its deadline may still commit
            found = self._read(rows.outcome, measured.organization_id)
        finally:
            self.stack.processes.stop(web)
        self._clear()
        made = found.jobs
        if made < 2:
            raise PeerError(f"Space Jobs web: {made} rows created by wrk's POSTs:\n{report.output[-1500:]}")
        span = (found.last_created - found.first_created).total_seconds()
        return rate_figure(made, span,
                           f"rows created by {report.answered} POSTs answered to wrk ({report.not_2xx}"
                           f" non-2xx, socket errors {report.socket_errors}), {connections} keep-alive"
                           f" connections, 2 wrk"
                           f" threads, `spacejobs web --workers {processes}`, first -> last created_at")

    def _post(self, base: str, tenant: Tenant, seconds: float, connections: int) -> WrkReport:
        """wrk POSTing ``bench.noop`` jobs to ``tenant``'s organization with its member's token."""
        script = post_script(self.log_dir, f"post-{tenant.organization_id}", f'{{"kind": "{KIND}"}}',
                             tenant.member.token)
        return run_wrk(f"{base}/api/v1/orgs/{tenant.organization_id}/jobs", script, seconds=seconds,
                       connections=connections)

    def rss_after(self, n: int, processes: int = 2) -> Figure:
        """VmRSS of each process of a worker (the consumer and its pool processes) after it has
        drained ``n`` jobs; the figure's value is the largest, in MB."""
        def sizes_of(worker: LoggedProcess) -> tuple[int, dict[int, float]]:
            tree = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
            return worker.pid, {proc.pid: vm_rss_mb(proc.pid) for proc in tree}

        _, (consumer, sizes) = self._drain(n, processes, sizes_of)
        each = ", ".join(f"{'consumer' if pid == consumer else 'pool'} {mb:.1f}"
                         for pid, mb in sizes.items())
        return Figure(max(sizes.values()), "MB", f"VmRSS after 1 worker -c {processes} drained {n} jobs:"
                                                 f" {each} MB")

    def claim_cost(self, finished: int, queued: int, samples: int = 200) -> ClaimCost:
        """``samples`` one-job claims (each its own transaction, as the worker role) on a table
        holding ``finished`` finished rows and ``queued`` queued ones (at least ``samples``).

        No EXPLAIN: the claim is one call of the SQL function claim_jobs(), whose plan EXPLAIN
        shows as a bare Function Scan; the ratio to the empty table's cost is the check."""
        queued = max(queued, samples)
        self._clear()
        with self.stack.admin() as conn:
            params = {"org": self.tenant.organization_id, "user": self.tenant.user_id}
            if finished:
                conn.execute(Q["fill_finished"], {**params, "n": finished})
            conn.execute(Q["fill_queued"], {**params, "n": queued})
            conn.execute(Q["analyze"])
        worker_db = self.stack.worker_db
        with transaction(worker_db) as conn:
            conn.execute(text("SELECT 1"))  # connected before the timing
        values = []
        for _ in range(samples):
            started = time.perf_counter()
            with transaction(worker_db, actor="worker:bench") as conn:
                leased = store.claim_batch(conn, "bench", limit=1)
            values.append(1000 * (time.perf_counter() - started))
            if len(leased) != 1:
                raise PeerError(f"Space Jobs claim cost: a claim leased {len(leased)} jobs")
        self._clear()
        p95 = percentile(values, 95)
        mean = statistics.fmean(values)
        return ClaimCost(finished, queued, Figure(
            mean, "ms", f"{samples} one-job claims (store.claim_batch, one transaction each, worker"
                        f" role) with {finished:,} finished and {queued:,} queued rows",
            {"mean": mean, "p95": p95}))

    def _cleanup(self) -> None:
        stack, servers = self.stack, self.servers
        self.stack = self.servers = None
        if getattr(self, "jobs", None) is not None:
            # The wait figure's LISTEN ends before its database is dropped, which would
            # otherwise cut it and log "listening for finished jobs failed".
            self.jobs.close()
        try:
            if stack is not None:
                stack.stop()
        finally:
            if servers is not None:
                servers.close()  # the template database; servers from the environment stay up


