"""Network partitions for the chaos run (``--partitions``): real cuts between "hosts".

Each worker, and the web the client submits through, runs in a network namespace of its own
(tests/kit/netns.py's ``Network``: a veth pair per host, the host ends on a bridge), and reaches
PostgreSQL and Redis over TCP at the bridge's address. A cut drops every packet between one host
and one server, in both directions, while the host's other links stay up (``Links``, beside
``Network``: two ``u32`` filters on the bridge's end of the host's veth pair send them to a
device whose queue holds no packet; healing deletes the two filters). The drop happens between
the hosts, as on a broken switch port: neither end's own TCP stack is told.

The cuts follow a fixed plan, each so many seconds into the submissions (``PLANS``; the run
makes the submissions last ``MIN_SUBMIT_SECONDS`` at least, so that every host is healed while
jobs still come). A cut host is left alone by the kills and the stall from its cut until
``PROTECT_AFTER_HEAL`` seconds after its last heal, so that the process that lived through the
cut is the one seen working again.

A cut from PostgreSQL takes the host that holds a probe: a ``bench.sleep`` submitted through
the API just before, which sleeps past the heal. Its attempt is cut off mid-run, its lease runs
out and another host runs the job again; once healed, the old attempt's next fenced write (its
lease heartbeat, or its finish) is turned down and it stops, while its process goes on claiming.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import Connection

from bench.chaos.driver import Fleet, Incarnation, log
from bench.harness import poll
from bench.hosts import PrivateCluster, on_host
from tests.kit import facts
from tests.kit.netns import Links, Network, remove_stale
from tests.kit.processes import LoggedProcess, free_port
from tests.kit.servers import Servers
from tests.kit.stack import Stack

# How long a cut lasts, in seconds after it began, per server. A cut from PostgreSQL outlasts
# the longest lease of the run's kinds (30 s, bench.sleep's is 10 s) and the sweeper's next look
# at it, so the cut host's jobs are taken over while it cannot reach the database, and its
# attempts meet the fence once it can.
PG_CUT_SECONDS = 35.0
REDIS_CUT_SECONDS = 15.0
WEB_CUT_SECONDS = 10.0
# A cut host is not killed or stalled until this long after its last heal: time to show that it
# claims again (the floor's idle claim comes within 10 s even if no wake-up reaches it).
PROTECT_AFTER_HEAL = 45.0
# The leases a cut host holds are read this long after the cut, when none of its finishes can
# still be on its way (read at the cut, a job finishing that instant would count as held).
HELD_READ_AFTER = 1.0


@dataclass(frozen=True)
class CutPlan:
    """One cut: its label, when (seconds after the submissions began), which host, and when
    each server it cuts is healed (seconds after the cut began, in the order they heal)."""

    label: str
    at: float
    host: str  # "worker" or "web"
    heals: tuple[tuple[str, float], ...]

    @property
    def servers(self) -> list[str]:
        return [server for server, _ in self.heals]


PLANS = (
    CutPlan("(a) worker cut from PostgreSQL", 3, "worker", (("PostgreSQL", PG_CUT_SECONDS),)),
    CutPlan("(b) worker cut from Redis", 12, "worker", (("Redis", REDIS_CUT_SECONDS),)),
    CutPlan("(c) web cut from Redis", 25, "web", (("Redis", WEB_CUT_SECONDS),)),
    CutPlan("(d) worker cut from both, PostgreSQL healed first", 35, "worker",
            (("PostgreSQL", PG_CUT_SECONDS), ("Redis", PG_CUT_SECONDS + 8))),
    CutPlan("(d) worker cut from both, Redis healed first", 50, "worker",
            (("Redis", REDIS_CUT_SECONDS - 3), ("PostgreSQL", PG_CUT_SECONDS))),
)
# The last heal comes 85 s in; the submissions go on for a while after it, so that every cut
# host has work to show that it claims again.
MIN_SUBMIT_SECONDS = 110.0
# A probe outlives its host's PostgreSQL heal by this long (bench.sleep sleeps 60 s at most).
PROBE_PAST_HEAL = 8.0
# While no host free to cut holds a probe, another is submitted this often (a probe may go to a
# host that is already cut, or stalled), up to PROBES_PER_CUT; after PROBE_PATIENCE the cut
# takes a busy host instead.
PROBE_EVERY = 3.0
PROBES_PER_CUT = 4
PROBE_PATIENCE = 15.0


@dataclass
class Cut:
    """One cut as it went: the host, the instants (``time.time()``), what it held."""

    plan: CutPlan
    host: str  # the incarnation's name (w1.0) or "web"
    namespace_index: int
    incarnation: Incarnation | None
    began: float
    healed: dict[str, float] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # jobs its processes held leases on at the cut
    held_read: bool = False
    log_offset_at_pg_heal: int | None = None
    submits_at_cut: tuple[int, int] = (0, 0)  # the web's: (attempted, accepted) so far
    submits_at_heal: tuple[int, int] = (0, 0)
    dropped: int = 0

    @property
    def last_heal(self) -> float | None:
        return max(self.healed.values()) if len(self.healed) == len(self.plan.heals) else None


class Partitions:
    """The cut plan, carried out by the chaos driver's thread (``tick``)."""

    def __init__(self, links: Links, fleet: Fleet, *, web_index: int, rng: random.Random,
                 lease_holders: Callable[[], dict[int, list[str]]],
                 submits: Callable[[], tuple[int, int]], submit_probe: Callable[[float], str | None],
                 plans: tuple[CutPlan, ...] = PLANS) -> None:
        self.links = links
        self.fleet = fleet
        self.web_index = web_index
        self.rng = rng
        self.lease_holders = lease_holders
        self.submits = submits
        self.submit_probe = submit_probe  # a bench.sleep of so many seconds; its id (None: refused)
        self.pending = sorted(plans, key=lambda plan: plan.at)
        self.cuts: list[Cut] = []
        self.probes: list[str] = []
        self._open: list[Cut] = []
        self._started: float | None = None
        self._probing: list[str] = []  # this cut's probes
        self._probe_times: list[float] = []  # when each was submitted (monotonic)

    def busy(self) -> bool:
        """Cuts still to make or to heal."""
        return bool(self.pending or self._open)

    def protected(self) -> set[int]:
        """Worker slots the kills and the stall must leave alone (cut, or healed too recently)."""
        now = time.time()
        return {cut.namespace_index for cut in self.cuts if cut.incarnation is not None
                and (cut.last_heal is None or now < cut.last_heal + PROTECT_AFTER_HEAL)}

    def tick(self, done: float, stalled: Incarnation | None) -> None:
        if self._started is None:
            self._started = time.monotonic()
        due = time.monotonic() - self._started >= self.pending[0].at if self.pending else False
        if self.pending and due and self._begin(self.pending[0], done, stalled):
            self.pending.pop(0)
            self._probing, self._probe_times = [], []
        now = time.time()
        for cut in list(self._open):
            if cut.incarnation is not None and not cut.held_read and now >= cut.began + HELD_READ_AFTER:
                holders = self.lease_holders()
                cut.held = [job for pid in cut.incarnation.pids for job in holders.get(pid, [])]
                cut.held_read = True
            for server, after in cut.plan.heals:
                if server not in cut.healed and now >= cut.began + after:
                    self._heal(cut, server)
            if cut.last_heal is not None:
                self._open.remove(cut)

    def heal_all(self) -> None:
        for cut in list(self._open):
            for server in cut.plan.servers:
                if server not in cut.healed:
                    self._heal(cut, server)
            self._open.remove(cut)

    def _begin(self, plan: CutPlan, done: float, stalled: Incarnation | None) -> bool:
        incarnation = None
        if plan.host == "web":
            index, name = self.web_index, "web"
        else:
            free = [slot for slot in self.fleet.ready_workers()
                    if slot not in self.protected() and self.fleet.slots[slot] is not stalled]
            holders = self.lease_holders()
            busy = [slot for slot in free
                    if (inc := self.fleet.slots[slot]) is not None and inc.pids & holders.keys()]
            # A host that holds leases shows the fence; an idle one is taken only at the end.
            choice = busy or (free if done >= 1.0 else [])
            if "PostgreSQL" in plan.servers:
                probing = self._probe_holder(plan, free, holders)
                if probing is None:
                    return False  # the probe is not leased yet
                choice = probing or choice
            if not choice:
                return False
            index = self.rng.choice(choice)
            incarnation = self.fleet.slots[index]
            assert incarnation is not None
            name = incarnation.name
        cut = Cut(plan, name, index, incarnation, time.time())
        if incarnation is None:
            cut.submits_at_cut = self.submits()
        for server in plan.servers:
            self.links.cut(index, server)
        self.cuts.append(cut)
        self._open.append(cut)
        log(f"cut {name} from {' and '.join(plan.servers)}: {plan.label}")
        return True

    def _probe_holder(self, plan: CutPlan, free: list[int], holders: dict[int, list[str]]
                      ) -> list[int] | None:
        """The free slot holding one of this plan's probes ([]: give up on the probes, take a
        busy host; None: wait), submitting probes as it goes."""
        now = time.monotonic()
        if len(self._probe_times) < PROBES_PER_CUT and (
                not self._probe_times or now - self._probe_times[-1] >= PROBE_EVERY):
            self._probe_times.append(now)
            job_id = self.submit_probe(dict(plan.heals)["PostgreSQL"] + PROBE_PAST_HEAL)
            if job_id is not None:
                self._probing.append(job_id)
                self.probes.append(job_id)
        for slot in free:
            incarnation = self.fleet.slots[slot]
            held = [job for pid in incarnation.pids for job in holders.get(pid, [])] if incarnation else []
            if any(job_id in held for job_id in self._probing):
                return [slot]
        return [] if now - self._probe_times[0] > PROBE_PATIENCE else None

    def _heal(self, cut: Cut, server: str) -> None:
        cut.dropped += self.links.heal(cut.namespace_index, server)
        cut.healed[server] = time.time()
        if server == "PostgreSQL" and cut.incarnation is not None and cut.incarnation.log.exists():
            cut.log_offset_at_pg_heal = cut.incarnation.log.stat().st_size
        if cut.incarnation is None:
            cut.submits_at_heal = self.submits()
        log(f"healed {cut.host}'s link to {server} after {cut.healed[server] - cut.began:.1f} s")


# Far above what one run sends: the run's client is one token per organization.
UNLIMITED = "100000000 per minute"


class Hosts:
    """The namespaces (one per worker slot, one for the web), the private servers on TCP, the
    drop classes, and the web process: everything ``--partitions`` adds, and its removal."""

    def __init__(self, directory: Path, workers: int) -> None:
        self.directory = directory
        self.workers = workers
        self.network = Network(workers + 1, 0.0)
        self.cluster: PrivateCluster | None = None
        self.links: Links | None = None
        self.web: LoggedProcess | None = None
        self.web_url = ""

    @property
    def web_index(self) -> int:
        return self.workers

    def start(self) -> Servers:
        """Namespaces, then PostgreSQL and Redis listening on 127.0.0.1 (beat, the run's own
        readings) and on the bridge (the hosts); returns them as the kit's servers."""
        if os.geteuid() != 0:
            raise PermissionError("--partitions creates network namespaces: run it as root")
        if stale := remove_stale():
            log(f"removed what runs {', '.join(stale)} left behind")
        self.network.create()
        self.directory.chmod(0o711)  # the cluster runs as postgres, below it
        self.cluster = PrivateCluster(self.directory / "servers", ["127.0.0.1", self.network.host_address],
                                      str(self.network.subnet))
        self.cluster.directory.mkdir()
        self.cluster.start()
        self.links = Links(self.network, {"PostgreSQL": self.cluster.pg_port,
                                          "Redis": self.cluster.redis_port})
        self.links.prepare()
        return Servers(self.cluster.admin_url("127.0.0.1"), self.cluster.redis_url("127.0.0.1"),
                       "private cluster")

    def software(self) -> str:
        assert self.cluster is not None
        return (f"PostgreSQL {self.cluster.version} (private cluster), redis-server (private), both "
                f"on TCP at {self.network.host_address} for the {self.network.hosts} namespaces of "
                f"{self.network.subnet} (workers and web) and on 127.0.0.1 for beat and the run")

    def _env(self, stack: Stack, **extra: str) -> dict[str, str]:
        bridge = self.network.host_address
        return stack.env(DATABASE_URL=on_host(stack.admin_url, bridge),
                         REDIS_URL=on_host(stack.redis_url, bridge), **extra)

    def worker_hosts(self, stack: Stack) -> list[tuple[list[str], dict[str, str]]]:
        return [(self.network.exec_prefix(n), self._env(stack)) for n in range(self.workers)]

    def start_web(self, stack: Stack) -> str:
        """``spacejobs web`` (gunicorn) in the web's namespace; returns its URL once it answers."""
        port = free_port()
        address = self.network.address(self.web_index)
        env = self._env(stack, SPACEJOBS_SUBMIT_RATE_LIMIT=UNLIMITED,
                        SPACEJOBS_ORG_SUBMIT_RATE_LIMIT=UNLIMITED, SPACEJOBS_API_RATE_LIMIT=UNLIMITED,
                        SPACEJOBS_POLL_RATE_LIMIT=UNLIMITED)
        self.web = LoggedProcess.start(
            "web", [*self.network.exec_prefix(self.web_index), sys.executable, "-m", "spacejobs.webapp.cli",
                    "web", "--host", address, "--port", str(port), "--workers", "1"],
            env=env, log_dir=stack.log_dir)
        self.web_url = f"http://{address}:{port}"

        def answers() -> bool:
            assert self.web is not None
            if not self.web.alive:
                raise RuntimeError(f"the web exited:\n{self.web.output()[-2000:]}")
            try:
                requests.get(self.web_url + "/api/v1/me", timeout=2)
            except requests.ConnectionError:
                return False
            return True

        if not poll(answers, 60, interval=0.2):
            raise RuntimeError("the web did not answer within 60 s")
        return self.web_url

    def web_log(self) -> str:
        return self.web.output() if self.web is not None else ""

    def close(self) -> None:
        """Every step runs, whatever failed before it (the caller has stopped the workers)."""
        steps: list[Callable[[], None]] = []
        if self.web is not None:
            steps.append(self.web.kill)
        if self.cluster is not None:
            steps.append(self.cluster.stop)
        steps.append(self.network.destroy)
        for step in steps:
            try:
                step()
            except Exception as exc:
                log(f"cleanup step failed: {type(exc).__name__}: {exc}")


class HttpApi:
    """The web over HTTP with the face of Flask's test client that bench/chaos/client.py uses:
    ``post``/``get`` answering ``status_code``, ``get_json`` and ``get_data``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.session = requests.Session()

    def post(self, path: str, *, json: Any = None, headers: dict[str, str] | None = None) -> HttpAnswer:
        return HttpAnswer(self.session.post(self.base_url + path, json=json, headers=headers, timeout=60))

    def get(self, path: str, *, headers: dict[str, str] | None = None) -> HttpAnswer:
        return HttpAnswer(self.session.get(self.base_url + path, headers=headers, timeout=60))


class HttpAnswer:
    def __init__(self, response: requests.Response) -> None:
        self.response = response
        self.status_code = response.status_code

    def get_json(self, silent: bool = False) -> Any:
        try:
            return self.response.json()
        except ValueError:
            if silent:
                return None
            raise

    def get_data(self, as_text: bool = False) -> str | bytes:
        return self.response.text if as_text else self.response.content


# ---------------------------------------------------------------------------------------------
# What each cut did, from the database (and the cut host's log after its heal)
# ---------------------------------------------------------------------------------------------

@dataclass
class CutFinding:
    """The facts that show a cut did something, and that its host came back."""

    label: str
    host: str
    servers: list[str]
    heals: list[tuple[str, float]]  # (server, seconds after the cut), in the order healed
    dropped: int
    is_web: bool
    held: int = 0
    held_probe: bool = False
    taken_over: int = 0
    claims_during: int = 0  # before the first heal
    claims_between: int = 0  # after the first heal, with the other server still cut
    first_claim_between: float | None = None  # seconds after the first heal
    claims_after: int = 0
    first_claim_after: float | None = None  # seconds after the last heal
    stale: tuple[int, int, int] = (0, 0, 0)  # finishes fenced, attempts stopped, failures discarded
    submits_during: tuple[int, int] = (0, 0)  # the web's: (attempted, accepted)
    jobs_during: dict[str, int] = field(default_factory=dict)  # their statuses at the end

    def note(self) -> str:
        heals = ", ".join(f"{server} healed +{seconds:.1f} s" for server, seconds in self.heals)
        text = f"{self.label}: {self.host}; {heals}; {self.dropped} packets dropped"
        if self.is_web:
            attempted, accepted = self.submits_during
            statuses = ", ".join(f"{n} {status}" for status, n in sorted(self.jobs_during.items()))
            return (f"{text}; {attempted} submits during the cut, {accepted} accepted (202): "
                    f"{statuses or 'none'} at the end")
        text += (f"; held {self.held} leases a second into the cut"
                 + (" (a probe among them)" if self.held_probe else ""))
        if "PostgreSQL" in self.servers:
            finishes, stopped, failures = self.stale
            text += (f", {self.taken_over} of them taken over (re-leased or swept) during it; "
                     f"after the PostgreSQL heal its log has {finishes} stale finishes fenced, "
                     f"{stopped} stale attempts stopped, {failures} stale failures discarded")
        text += f"; {self.claims_during} claims while cut"
        if len(self.heals) > 1:
            first = ("none" if self.first_claim_between is None
                     else f"the first +{self.first_claim_between:.1f} s after it")
            text += (f", {self.claims_between} once {self.heals[0][0]} was healed and "
                     f"{self.heals[1][0]} still cut ({first})")
        if self.first_claim_after is None:
            return text + "; NO claim after the heal"
        return (text + f"; claimed again +{self.first_claim_after:.1f} s after the last heal "
                       f"({self.claims_after} claims after it)")


def cut_findings(cuts: list[Cut], conn: Connection, claims: list[tuple[str, datetime]],
                 accepted: list[str], probes: list[str], stale_markers: tuple[str, str, str]
                 ) -> list[CutFinding]:
    """``accepted``: the ids the client was given, in order (the web cut's are a slice);
    ``probes``: the ids of the probes among them, which the web cut's figures leave out."""
    by_pid: dict[int, list[float]] = {}
    for actor, at in claims:
        pid = actor.rsplit(":", 1)[-1]
        if pid.isdigit():
            by_pid.setdefault(int(pid), []).append(at.timestamp())
    outcomes = facts.outcomes(conn)
    findings = []
    for cut in cuts:
        healed = sorted(cut.healed.items(), key=lambda item: item[1])
        finding = CutFinding(cut.plan.label, cut.host, cut.plan.servers,
                             [(server, at - cut.began) for server, at in healed], cut.dropped,
                             cut.incarnation is None)
        last_heal = cut.last_heal or time.time()
        if cut.incarnation is None:
            (attempted_0, accepted_0), (attempted_1, accepted_1) = cut.submits_at_cut, cut.submits_at_heal
            during = [job_id for job_id in accepted[accepted_0:accepted_1] if job_id not in probes]
            finding.submits_during = (attempted_1 - attempted_0, len(during))
            finding.jobs_during = dict(Counter(
                str(outcomes[job_id].status) if job_id in outcomes else "missing" for job_id in during))
            findings.append(finding)
            continue
        worker = cut.incarnation
        times = sorted(t for pid in worker.pids for t in by_pid.get(pid, [])
                       if t >= worker.started and (worker.ended is None or t <= worker.ended))
        finding.held = len(cut.held)
        finding.held_probe = any(job_id in probes for job_id in cut.held)
        first_heal = min(cut.healed.values(), default=last_heal)
        finding.claims_during = sum(1 for t in times if cut.began <= t < first_heal)
        between = [t for t in times if first_heal <= t < last_heal]
        finding.claims_between = len(between)
        finding.first_claim_between = between[0] - first_heal if between else None
        after = [t for t in times if t >= last_heal]
        finding.claims_after = len(after)
        finding.first_claim_after = after[0] - last_heal if after else None
        if "PostgreSQL" in cut.plan.servers:
            finding.taken_over = facts.taken_over_between(conn, cut.held, cut.began,
                                                          cut.healed.get("PostgreSQL", last_heal))
            if cut.log_offset_at_pg_heal is not None:
                with worker.log.open("rb") as handle:
                    handle.seek(cut.log_offset_at_pg_heal)
                    tail = handle.read().decode(errors="replace")
                finishes, stopped, failures = (tail.count(marker) for marker in stale_markers)
                finding.stale = (finishes, stopped, failures)
        findings.append(finding)
    return findings
