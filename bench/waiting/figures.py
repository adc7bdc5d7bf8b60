"""The measurements of bench.waiting, on one stack (tests/kit) with its worker and beat
processes running throughout, as a deployment runs them. Each figure gives its jobs an
organization of their own and reads what happened from the rows and events (records.py).
"""

from __future__ import annotations

import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.harness import Deadline, poll
from bench.waiting import records
from bench.waiting.usage import cpu_shares
from spacejobs.models.jobs import canvas as workflows
from spacejobs.models.jobs.records import Status
from spacejobs.models.jobs.service import JobRequest, Jobs
from spacejobs.tasks.wakeups import WakeupPublisher
from tests.kit.broker import queue_length
from tests.kit.private_servers import RestartableRedis
from tests.kit.processes import LoggedProcess
from tests.kit.seeding import Tenant
from tests.kit.stack import Stack

BATCH = 1000  # submit_many's most per call
SIGNAL = "go"
#: what a waiting job of the slots figure waits for: longer than any run of the benchmark
FAR = 3600.0
SETTLE = 3.0  # seconds for a worker to stop lingering (1 s by default) and go quiet
#: Redis stopped: seconds after the timers all wait before Redis is stopped, past the workers'
#: linger (1 s after the last job they ran, by default), so that the outage falls on quiet
#: workers whose jobs all wait; the timers' first due moment is that much later too
QUIET = 3.0
#: seconds the workers get to finish the timers once Redis is back, before they are replaced
RECOVERY = 30.0
#: a chain's step: a kind that does nothing, so the chain's time is the machinery's
CHAIN_STEP = "bench.noop"
#: a group's step: a kind that takes the seconds it is given (checkpointing as it goes), and
#: the burst's jobs before it
GROUP_STEP = "bench.sleep"
BURST_JOB = "bench.noop"
#: the cancel figure's fan-out step, and how long each grandchild would sleep uncancelled
FAN_KIND = "bench_waiting.fan"
CANCEL_CHILD_SECONDS = 60.0
#: beat's line for a tick in which the sweep's chores ran (tasks/maintenance/schedule.py)
SWEEP_LINE = re.compile(r"maintenance ran in ([\d.]+)s")


class BenchError(RuntimeError):
    """A figure could not be measured (a process died, jobs did not get where they must)."""


def say(line: str) -> None:
    """Progress, on stderr (the report goes to stdout)."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class SlotsFigure:
    jobs: int
    parked_seconds: float  # the submit to the last of them waiting
    #: wake-ups still in the queue when the last of them waited (sent for the backlog while
    #: they were being parked), and the seconds until the workers had taken them all
    stale_wakeups: int
    stale_seconds: float
    idle: list[float]  # the workers' CPU, % of a core, per reading with no job waiting
    waiting: list[float]  # the same with every job waiting
    beat_idle: list[float]
    beat_waiting: list[float]
    sweep_idle: list[float]  # seconds per sweep, from beat's log
    sweep_waiting: list[float]
    most_holding_a_lease: int  # the most of the jobs holding a lease in any reading
    lease_readings: int
    still_waiting: int  # waiting at the end of the readings


@dataclass(frozen=True)
class TimerFigure:
    count: int
    spread: float  # seconds between the first and the last due moment
    redis_running: bool
    timers: list[records.Timer]
    patience: float  # seconds after the last due moment the benchmark waited
    recovered_in: float | None  # Redis stopped: seconds after its restart until all completed
    workers_replaced: bool = False  # Redis stopped: they had not finished RECOVERY s after it


@dataclass(frozen=True)
class DrainFigure:
    jobs: int
    seconds: float
    detail: str

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


@dataclass(frozen=True)
class ChainFigure:
    steps: int
    seconds: float  # the workflow's submit to its completion
    work: float  # the steps' own work (each one's lease to its completion), summed
    runs: int  # the workflow's runs

    @property
    def overhead_per_step(self) -> float:
        """Seconds per step beyond the steps' own work."""
        return (self.seconds - self.work) / self.steps


@dataclass(frozen=True)
class GroupFigure:
    step_seconds: float  # each of the two steps' own work
    burst: int  # short jobs the workers drained just before
    seconds: float  # the workflow's submit to its completion
    steps_seconds: float  # its steps' first lease to their last completion
    given_back: int  # steps a process gave back unstarted for another to run


@dataclass(frozen=True)
class CancelFigure:
    seconds: float  # the workflow's cancel to its running grandchild's cancelled event
    ran: float  # how long the grandchild had run when the cancel was asked


class WaitingBench:
    """One stack, its workers and beat, and the producer's API, for the figures."""

    def __init__(self, stack: Stack, redis: RestartableRedis, *, workers: int, concurrency: int) -> None:
        self.stack = stack
        self.redis = redis
        self.publisher = WakeupPublisher(stack.redis_url, stack.queue)
        self.jobs = Jobs(stack.app_db, wake=self.publisher.wake)
        self.concurrency = concurrency
        self.workers: list[LoggedProcess] = [stack.start_worker(concurrency) for _ in range(workers)]
        self.beat = stack.start_beat()

    # -- helpers ---------------------------------------------------------------------------

    def read(self, reader: Callable[..., Any], *args: Any) -> Any:
        with self.stack.admin() as conn:
            return reader(conn, *args)

    def tenant(self, label: str) -> Tenant:
        return self.stack.tenant(f"{label}-{uuid.uuid4().hex[:6]}")

    def submit(self, tenant: Tenant, requests: list[JobRequest]) -> None:
        for first in range(0, len(requests), BATCH):
            with self.stack.app_db.begin() as conn:
                self.jobs.submit_many(conn, requests[first:first + BATCH],
                                      organization_id=tenant.organization_id,
                                      requested_by=tenant.user_id)

    def count(self, tenant: Tenant, *statuses: str) -> int:
        found = self.read(records.statuses, tenant.organization_id)
        return sum(found[status] for status in statuses)

    def wait(self, what: str, done: Callable[[], object], within: float | Deadline,
             interval: float = 0.2) -> None:
        if not poll(done, within, interval=interval, between=self.stack.processes.check_alive):
            logs = "\n".join(f"--- {p.name}\n{p.output()[-1500:]}" for p in self.stack.processes)
            raise BenchError(f"{what}: not reached\n{logs}")

    def wait_quiet(self) -> None:
        """Until the workers have logged nothing for SETTLE seconds (each wake-up they take
        logs its receipt and its end): no task running, none reserved."""
        def sizes() -> list[int]:
            return [worker.log.stat().st_size for worker in self.workers]

        seen = {"sizes": sizes(), "since": time.monotonic()}

        def quiet() -> bool:
            now = sizes()
            if now != seen["sizes"]:
                seen.update(sizes=now, since=time.monotonic())
            return time.monotonic() - seen["since"] >= SETTLE

        self.wait("the workers quiet", quiet, 120, interval=0.25)

    def _pids(self) -> dict[str, list[int]]:
        return {"workers": [worker.pid for worker in self.workers], "beat": [self.beat.pid]}

    def _sweeps_during(self, measure: Callable[[], Any]) -> tuple[Any, list[float]]:
        """What ``measure`` returned, and the durations of the sweeps beat logged meanwhile."""
        before = len(self.beat.output())
        found = measure()
        return found, [float(s) for s in SWEEP_LINE.findall(self.beat.output()[before:])]

    def _cpu_readings(self, samples: int, seconds: float,
                      meanwhile: Callable[[], None] | None = None
                      ) -> tuple[list[float], list[float], list[float]]:
        """The workers' and beat's CPU per reading, and the sweeps' durations meanwhile."""
        def measure() -> list[dict[str, float]]:
            return [cpu_shares(self._pids(), seconds, meanwhile=meanwhile) for _ in range(samples)]

        readings, sweeps = self._sweeps_during(measure)
        return [r["workers"] for r in readings], [r["beat"] for r in readings], sweeps

    # -- slots -----------------------------------------------------------------------------

    def slots(self, jobs: int, samples: int, seconds: float) -> SlotsFigure:
        """``jobs`` jobs waiting, half on a timer and half on a signal, neither due during the
        figure: how many hold a lease, and the workers' CPU then and with none waiting."""
        tenant = self.tenant("slots")
        self.wait_quiet()
        say(f"  slots: the workers idle, {samples} readings of {seconds:g} s")
        idle, beat_idle, sweep_idle = self._cpu_readings(samples, seconds)
        on_timers = jobs // 2
        requests = [JobRequest("bench.wait", {"seconds": FAR})] * on_timers + [
            JobRequest("bench.await_signal", {"name": SIGNAL, "timeout": FAR})] * (jobs - on_timers)
        say(f"  slots: submitting {jobs:,} jobs that wait")
        started = time.monotonic()
        self.submit(tenant, requests)
        self.wait(f"{jobs:,} jobs waiting", lambda: self.count(tenant, Status.WAITING) == jobs,
                  60 + jobs / 20, interval=0.5)
        parked = time.monotonic() - started
        # The readings are of workers with nothing to do: the wake-ups sent while the jobs were
        # parked, which the workers take one at a time, are taken first (and counted).
        stale = queue_length(self.stack.redis_url, self.stack.queue)
        started = time.monotonic()
        self.wait("the wake-up queue empty",
                  lambda: queue_length(self.stack.redis_url, self.stack.queue) == 0,
                  60 + 2 * stale, interval=0.5)
        self.wait_quiet()
        stale_seconds = time.monotonic() - started
        leases: list[int] = []

        def read_leases() -> None:
            leases.append(self.read(records.holding_a_lease, tenant.organization_id))

        say(f"  slots: {jobs:,} waiting (after {parked:.1f} s; then {stale} wake-ups left, taken in"
            f" {stale_seconds:.1f} s), {samples} readings of {seconds:g} s")
        read_leases()
        waiting, beat_waiting, sweep_waiting = self._cpu_readings(samples, seconds, read_leases)
        read_leases()
        still = self.count(tenant, Status.WAITING)
        self.read(records.forget, tenant.organization_id)
        self.wait_quiet()
        say(f"  slots: the workers idle again, {samples} readings of {seconds:g} s")
        idle_after, beat_after, sweep_after = self._cpu_readings(samples, seconds)
        return SlotsFigure(jobs, parked, stale, stale_seconds, idle + idle_after, waiting,
                           beat_idle + beat_after, beat_waiting, sweep_idle + sweep_after,
                           sweep_waiting, max(leases, default=0), len(leases), still)

    # -- timers ----------------------------------------------------------------------------

    def timers(self, count: int, spread: float, *, lead: float, patience: float,
               redis_running: bool) -> TimerFigure:
        """``count`` timers due from ``lead`` seconds from now, evenly over ``spread`` seconds
        (0: all at the same moment). With ``redis_running`` false, Redis is stopped QUIET
        seconds after they all wait (the first due moment is as much later), and started again
        after the last due moment and ``patience``; workers that have not finished them
        RECOVERY seconds later are replaced, so that the next figure has workers."""
        tenant = self.tenant("timers")
        first = datetime.now(UTC) + timedelta(seconds=lead + (0 if redis_running else QUIET))
        step = spread / (count - 1) if count > 1 else 0.0
        moments = [first + timedelta(seconds=i * step) for i in range(count)]
        self.submit(tenant, [JobRequest("bench_waiting.until", {"at": m.isoformat()}) for m in moments])
        until_first = Deadline((first - datetime.now(UTC)).total_seconds()
                               - (0 if redis_running else QUIET))
        poll(lambda: self.count(tenant, Status.WAITING) == count, until_first, interval=0.1)
        if not redis_running:
            time.sleep(QUIET)
            self.redis.kill()
        patience_ends = moments[-1] + timedelta(seconds=patience)

        def all_completed() -> bool:
            return self.count(tenant, Status.COMPLETED) == count

        try:
            poll(all_completed, Deadline((patience_ends - datetime.now(UTC)).total_seconds()),
                 interval=0.25, between=self.stack.processes.check_alive)
            found = self.read(records.timers, tenant.organization_id)
        finally:
            if not redis_running:
                self.redis.start()
        if redis_running:
            return TimerFigure(count, spread, True, found, patience, None)
        back = time.monotonic()
        if poll(all_completed, RECOVERY, interval=0.25):
            return TimerFigure(count, spread, False, found, patience, time.monotonic() - back)
        say(f"  the workers did not finish the timers {RECOVERY:g} s after Redis came back:"
            " replacing them")
        self.replace_workers()
        self.wait("the timers completed by new workers", all_completed, RECOVERY)
        return TimerFigure(count, spread, False, found, patience, None, workers_replaced=True)

    def replace_workers(self) -> None:
        concurrency = self.concurrency
        self.stack.retire(*self.workers)
        self.workers = [self.stack.start_worker(concurrency) for _ in self.workers]

    # -- fan-out ---------------------------------------------------------------------------

    def plain_drain(self, jobs: int) -> DrainFigure:
        """``jobs`` bench.noop jobs submitted at once to the running workers: first lease to
        last completion."""
        tenant = self.tenant("plain")
        self.submit(tenant, [JobRequest("bench.noop")] * jobs)
        self.wait(f"{jobs:,} bench.noop completed",
                  lambda: self.count(tenant, Status.COMPLETED) == jobs, 60 + jobs / 10)
        time.sleep(0.5)  # a job run twice would show as a second chain of events
        span = self.read(records.drain_span, tenant.organization_id)
        if span.clean != jobs or span.seconds is None:
            raise BenchError(f"plain drain: {span.clean} of {jobs} jobs ran exactly once")
        return DrainFigure(jobs, span.seconds, "first lease -> last completion (job_events)")

    def fan_drain(self, children: int, max_parallel: int) -> DrainFigure:
        """One bench_waiting.fan parent of ``children`` bench.noop, ``max_parallel`` at a time:
        the parent's first lease to its completion."""
        tenant = self.tenant("fan")
        self.submit(tenant, [JobRequest("bench_waiting.fan",
                                        {"children": children, "max_parallel": max_parallel})])
        self.wait(f"a fan-out of {children:,} completed",
                  lambda: self.count(tenant, Status.COMPLETED, Status.FAILED) == children + 1,
                  60 + children / 5)
        time.sleep(0.5)
        span = self.read(records.fan_span, tenant.organization_id)
        if (span.parent_status != Status.COMPLETED or span.clean_children != children
                or span.seconds is None):
            raise BenchError(f"fan-out: parent {span.parent_status}, {span.clean_children} of"
                             f" {children} children ran exactly once")
        return DrainFigure(children, span.seconds,
                           f"the parent's first lease -> its completion (job_events), {span.runs}"
                           " runs of the parent")

    # -- chain ---------------------------------------------------------------------------------

    def chain(self, steps: int) -> ChainFigure:
        """A workflow ``chain`` of ``steps`` bench.noop, submitted as one job: its submit to its
        completion, and the steps' own work, from the events."""
        tenant = self.tenant("chain")
        canvas = workflows.chain(*[workflows.sig(CHAIN_STEP) for _ in range(steps)])
        with self.stack.app_db.begin() as conn:
            self.jobs.submit_workflow(conn, canvas, organization_id=tenant.organization_id,
                                      requested_by=tenant.user_id)
        self.wait(f"a chain of {steps} completed",
                  lambda: self.count(tenant, Status.COMPLETED, Status.FAILED) == steps + 1,
                  60 + steps)
        time.sleep(0.5)  # a step run twice would show as a second chain of events
        span = self.read(records.chain_span, tenant.organization_id)
        if (span.workflow_status != Status.COMPLETED or span.clean_steps != steps
                or span.seconds is None or span.work is None):
            raise BenchError(f"chain: workflow {span.workflow_status}, {span.clean_steps} of"
                             f" {steps} steps ran exactly once")
        return ChainFigure(steps, span.seconds, span.work, span.runs)

    # -- group -----------------------------------------------------------------------------

    def group(self, step_seconds: float, burst: int) -> GroupFigure:
        """A workflow ``group`` of two ``step_seconds`` bench.sleep steps, submitted the moment
        the workers have drained ``burst`` bench.noop (their pool processes still linger, their
        claims sized for short jobs): its submit to its completion."""
        warm = self.tenant("burst")
        self.submit(warm, [JobRequest(BURST_JOB)] * burst)
        self.wait(f"{burst:,} {BURST_JOB} completed",
                  lambda: self.count(warm, Status.COMPLETED) == burst, 60 + burst / 10,
                  interval=0.05)
        tenant = self.tenant("group")
        canvas = workflows.group(*[workflows.sig(GROUP_STEP, seconds=step_seconds)
                                   for _ in range(2)])
        with self.stack.app_db.begin() as conn:
            self.jobs.submit_workflow(conn, canvas, organization_id=tenant.organization_id,
                                      requested_by=tenant.user_id)
        self.wait("a group of two steps completed",
                  lambda: self.count(tenant, Status.COMPLETED, Status.FAILED) == 3,
                  60 + 4 * step_seconds, interval=0.05)
        time.sleep(0.5)  # a step run twice would show as a second completion
        span = self.read(records.group_span, tenant.organization_id)
        self.read(records.forget, warm.organization_id)
        if (span.workflow_status != Status.COMPLETED or span.completed_once != 2
                or span.seconds is None or span.steps_seconds is None):
            raise BenchError(f"group: workflow {span.workflow_status}, {span.completed_once} of 2"
                             " steps completed exactly once")
        return GroupFigure(step_seconds, burst, span.seconds, span.steps_seconds, span.given_back)

    # -- cancel ----------------------------------------------------------------------------

    def cancel(self, running_for: float) -> CancelFigure:
        """A workflow whose step fans out bench.sleep children one at a time; once the first
        grandchild has run ``running_for`` seconds, the workflow is cancelled as its requester
        would: from that cancel to the grandchild's cancelled event (job_events)."""
        tenant = self.tenant("cancel")
        canvas = workflows.chain(workflows.sig(FAN_KIND, children=2, max_parallel=1,
                                               child_seconds=CANCEL_CHILD_SECONDS))
        with self.stack.app_db.begin() as conn:
            workflow = self.jobs.submit_workflow(conn, canvas, organization_id=tenant.organization_id,
                                                 requested_by=tenant.user_id).job
        # The workflow, its step and the first grandchild: the last one leased (running).
        self.wait("a grandchild running", lambda: self.count(tenant, Status.LEASED) == 1
                  and self.count(tenant, Status.WAITING) == 2, 60, interval=0.05)
        time.sleep(running_for)
        with self.jobs.transaction(tenant.organization_id, tenant.user_id) as (conn, member):
            self.jobs.cancel(conn, member, workflow.id)
        self.wait("the tree cancelled", lambda: self.count(tenant, Status.CANCELLED) == 3,
                  30 + CANCEL_CHILD_SECONDS, interval=0.05)
        span = self.read(records.cancel_span, tenant.organization_id)
        if (span.workflow_status != Status.CANCELLED or span.grandchildren != 1
                or span.grandchild_statuses != Status.CANCELLED or span.seconds is None):
            raise BenchError(f"cancel: workflow {span.workflow_status}, {span.grandchildren}"
                             f" grandchild(ren) {span.grandchild_statuses}")
        return CancelFigure(span.seconds, running_for)

    def close(self) -> None:
        self.jobs.close()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
