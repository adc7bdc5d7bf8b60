"""The printed report of a chaos run: its configuration, what the client saw, the faults, what
the database says, and one line per invariant (``ok`` or ``FAIL``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.composites import CompositeFindings, example_lines
from bench.chaos.driver import STALE_FAILURE, STALE_FINISH, STALE_STOPPED, STALL_SECONDS
from bench.chaos.partitions import CutFinding


@dataclass(frozen=True)
class Verdict:
    """One invariant judged: its name, whether it held, and the figures that say so."""

    name: str
    ok: bool
    detail: str


@dataclass
class ChaosReport:
    """Every figure of one run. The client and the driver fill in what they saw; the database
    half is read once every accepted job is terminal."""

    # configuration
    jobs_planned: int = 0
    workers: int = 0
    concurrency: int = 0
    kill_every: float = 0.0
    cancel_fraction: float = 0.0
    max_sleep: float = 0.0
    workflows_fraction: float = 0.0
    waits_fraction: float = 0.0
    workflow_cancel_fraction: float = 0.0
    seed: int = 0
    organizations: int = 0
    submit_rate: float = 0.0
    software: str = ""
    # what the client saw
    submits_attempted: int = 0
    accepted: int = 0
    refused_503: int = 0
    unexpected_answers: list[str] = field(default_factory=list)
    cancels_asked: int = 0
    cancel_answers: dict[str, int] = field(default_factory=dict)
    cancel_503_retries: int = 0
    submitted_by_shape: dict[str, int] = field(default_factory=dict)
    signals_asked: int = 0
    signal_answers: dict[str, int] = field(default_factory=dict)
    signal_503_retries: int = 0
    late_signals_not_waiting: int = 0
    wakeups_not_published: int = 0
    # faults
    kills: int = 0
    stalls: int = 0
    worker_restarts: int = 0
    redis_restarts: int = 0
    pg_restarts: int = 0
    restart_notes: list[str] = field(default_factory=list)
    survivors_not_resumed: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    beat_sweeps_after_last_restart: int | None = None
    sweeps_ran: int = 0
    sweeps_failed: int = 0
    sweeps_expired: int = 0
    stall_notes: list[str] = field(default_factory=list)
    # --partitions: the cuts planned, and what each one did
    partitions: bool = False
    cuts_planned: int = 0
    probes: int = 0
    cut_findings: list[CutFinding] = field(default_factory=list)
    # from the database
    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    failed_by_code: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    rows_without_202: int = 0
    finished_twice: int = 0
    cancelled_unasked: int = 0
    cancel_answer_contradicted: int = 0
    still_leased: int = 0
    active_counts_off: int = 0
    broken_event_chains: int = 0
    status_disagrees_with_events: int = 0
    attempts_histogram: dict[int, int] = field(default_factory=dict)
    relet_after_expiry: int = 0
    expired_by_sweeper: int = 0
    resignalled_by_sweeper: int = 0
    composites: CompositeFindings = field(default_factory=CompositeFindings)
    # from the worker logs
    stale_finishes_fenced: int = 0
    stale_attempts_stopped: int = 0
    stale_failures_fenced: int = 0
    # time
    wall_seconds: float = 0.0
    submit_seconds: float = 0.0
    drain_seconds: float = 0.0
    timed_out: bool = False
    error: str | None = None

    def render(self, verdicts: Sequence[Verdict]) -> str:
        """The report as printed: figures, then one line per invariant."""
        title = "Space Jobs chaos run" + ("" if all(v.ok for v in verdicts) else "  (INVARIANT FAILED)")
        cancels = ", ".join(f"{k}: {n}" for k, n in sorted(self.cancel_answers.items())) or "none"
        histogram = ", ".join(f"{k}: {v}" for k, v in sorted(self.attempts_histogram.items()))
        failed_codes = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed_by_code.items()))
        shapes = ", ".join(f"{k} {v}" for k, v in sorted(self.submitted_by_shape.items())) or "none"
        rows = [
            ("configuration",
             f"{self.jobs_planned} jobs: {1 - self.workflows_fraction - self.waits_fraction:.0%} "
             f"bench.sleep (0-{self.max_sleep:g} s), {self.waits_fraction:.0%} waiting (bench.wait, "
             f"bench.await_signal), {self.workflows_fraction:.0%} workflows and fan-outs; "
             f"{self.organizations} organizations, submitted at {self.submit_rate:.1f}/s; "
             f"{self.workers} x `celery -A spacejobs.tasks.celery_app worker -c "
             f"{self.concurrency}` (prefork) "
             f"+ 1 beat; kill every ~{self.kill_every:g} s; cancel {self.cancel_fraction:.0%} of "
             f"plain and waiting jobs, {self.workflow_cancel_fraction:.0%} of workflows; seed {self.seed}"),
            ("servers", f"private to this run: {self.software}"),
            ("wall time", f"{self.wall_seconds:.1f} s (submitting {self.submit_seconds:.1f} s, "
                          f"then {self.drain_seconds:.1f} s until every job was terminal)"),
            ("submits", f"{self.submits_attempted} attempted: {self.accepted} accepted (202), "
                        f"{self.refused_503} refused at submit (503, not jobs)"
                        + (f"; and {self.probes} probes of the cuts (accepted)" if self.partitions else "")),
            ("accepted by shape", shapes),
            ("cancels", f"{self.cancels_asked} asked: {cancels}; {self.cancel_503_retries} "
                        "answers 503 asked again"),
            ("signals", f"{self.signals_asked} asked: " + (", ".join(
                f"{k}: {n}" for k, n in sorted(self.signal_answers.items())) or "none")
                + f"; {self.signal_503_retries} answers 503 asked again; "
                f"{self.late_signals_not_waiting} late ones sent before their job was seen waiting "
                "(a minute of polls)"),
            ("kills", f"{self.kills} SIGKILLs of a worker's process group, {self.worker_restarts} "
                      f"worker restarts; {self.stalls} workers stalled (SIGSTOP) for "
                      f"{STALL_SECONDS:g} s, longer than the lease"),
            ("server restarts", f"{self.redis_restarts} Redis, {self.pg_restarts} PostgreSQL"),
            *(("", note) for note in self.restart_notes),
            *self._partition_rows(),
            ("wake-ups", f"{self.wakeups_not_published} not published at submit (broker down); "
                         f"{self.resignalled_by_sweeper} jobs re-signalled by the sweeper"),
            ("", "--- from the database (space_operator) ---"),
            ("jobs submitted", f"{self.accepted} (accepted 202)"),
            ("completed", str(self.completed)),
            ("cancelled", str(self.cancelled)),
            ("failed", f"{self.failed}" + (f" ({failed_codes})" if failed_codes else "")),
            ("lost", f"{self.lost}   must be 0"),
            ("finished twice", f"{self.finished_twice}   must be 0 (jobs with >1 '-> completed' event)"),
            ("still leased", f"{self.still_leased}   must be 0"),
            ("active counts off", f"{self.active_counts_off}   must be 0 ((organization, kind)"
                                  " pairs whose quota count is not their active jobs; as the owner)"),
            ("event chains broken", f"{self.broken_event_chains + self.status_disagrees_with_events}"
                                    "   must be 0"),
            ("rows without a 202", f"{self.rows_without_202} (commit outcome unknown to the client)"),
            ("attempts histogram", (histogram or "empty") + " (accepted jobs, not their steps)"),
            *self._composite_rows(),
            ("expired leases", f"{self.relet_after_expiry} re-leased by a worker (leased -> leased), "
                               f"{self.expired_by_sweeper} ended or re-queued by the sweeper"),
            ("stale finishes fenced",
             f"{self.stale_finishes_fenced} ('{STALE_FINISH}' lines in all worker logs)"),
            ("", f"other stale attempts: {self.stale_attempts_stopped} stopped at a checkpoint "
                 f"('{STALE_STOPPED}'), {self.stale_failures_fenced} failures discarded "
                 f"('{STALE_FAILURE}')"),
        ]
        rows += [("", note) for note in self.stall_notes]
        rows.append(("sweeps", f"{self.sweeps_ran} ran (beat's ticks of the sweep's chores, and "
                               f"sweeps asked of a worker), {self.sweeps_failed} failed (a chore's "
                               f"outage, or a worker's sweep), {self.sweeps_expired} asked of a "
                               "worker expired in the queue (worker and beat logs)"))
        if self.beat_sweeps_after_last_restart is not None:
            rows.append(("beat", f"{self.beat_sweeps_after_last_restart} ticks of the sweep's "
                                 "chores after the last server restart"))
        width = max(len(k) for k, _ in rows)
        lines = [title, "=" * len(title)]
        lines += [f"{k.ljust(width)} : {v}" if k else f"{' ' * width}   {v}" for k, v in rows]
        lines.append("")
        for verdict in verdicts:
            lines.append(f"{'ok  ' if verdict.ok else 'FAIL'} {verdict.name}: {verdict.detail}")
        for answer in self.unexpected_answers[:5]:
            lines.append(f"     unexpected answer: {answer}")
        for note in [*self.survivors_not_resumed, *self.unexpected_exits,
                     *example_lines(self.composites)]:
            lines.append(f"     {note}")
        return "\n".join(lines)

    def _partition_rows(self) -> list[tuple[str, str]]:
        if not self.partitions:
            return []
        return [("partitions",
                 f"{len(self.cut_findings)} of {self.cuts_planned} planned cuts made: every packet "
                 "between the host and the server dropped, both ways (tc u32 filters on the "
                 "bridge's end of the host's veth pair redirect them to a sink)"),
                *(("", finding.note()) for finding in self.cut_findings)]

    def _composite_rows(self) -> list[tuple[str, str]]:
        c = self.composites
        by_status = ", ".join(f"{k} {v}" for k, v in sorted(c.parents.items())) or "none"
        steps = ", ".join(f"{k} {v}" for k, v in sorted(c.steps.items())) or "none"
        signal_jobs = ", ".join(f"{k} {v}" for k, v in sorted(c.signal_jobs.items())) or "none"
        late = sorted(seconds for _, _, seconds in c.started_after_cancel)
        return [
            ("workflows", f"{sum(c.parents.values())} workflows and fan-outs: {by_status}; "
                          f"{c.cancelled_parents} had a cancel take effect"),
            ("steps", f"{sum(c.steps.values())} child jobs: {steps}"),
            ("", f"{c.places_with_two_children} places with two children, "
                 f"{c.children_completed_twice} steps completed twice, "
                 f"{c.completed_parents_missing_steps} completed parents without one completed "
                 f"step per place, {c.results_not_the_steps} whose result is not their steps', "
                 f"{c.draws_not_recorded_once} fan-out draws not the recorded step"),
            ("", f"{len(c.started_after_cancel)} steps leased or created after their "
                 "workflow's cancel took effect"
                 + (f" (up to {late[-1]:.3f} s after)" if late else "")
                 + f"; {c.steps_cancelled_alone} cancelled while their workflow went on"),
            ("timers", f"{c.timers_completed} bench.wait jobs and steps completed, "
                       f"{c.timers_early} before their recorded moment"),
            ("signal jobs", f"{signal_jobs}; first signal sent before the job waited: "
                            f"{c.signals_before_wait}, after: {c.signals_after_wait}"),
            ("waiting watch", f"{c.waits_met_readings} readings while the run went: at most "
                              f"{c.waits_met_seen} waiting jobs with their condition met; "
                              f"{c.waits_met_at_end} at the end"),
        ]

