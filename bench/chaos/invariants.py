"""What a chaos run must never break, and the evidence for it.

The evidence is read from the database through the kit's facts (``tests/kit/facts.py``) once
every accepted job is terminal, and set beside what the client was told; each invariant is
then a small function of the report that says whether it held and with which figures.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from sqlalchemy import Connection

from bench.chaos.client import ClientTally
from bench.chaos.composites import TIMER_SLACK_SECONDS
from bench.chaos.driver import Restart
from bench.chaos.report import ChaosReport, Verdict
from spacejobs.models.jobs.records import TERMINAL, Status
from tests.kit import facts

# ---------------------------------------------------------------------------------------------
# The evidence
# ---------------------------------------------------------------------------------------------


def read_database(report: ChaosReport, conn: Connection, tally: ClientTally) -> list[tuple[str, datetime]]:
    """Fills the database half of the report; returns the workers' claims (actor, at)."""
    accepted = tally.accepted
    found = facts.outcomes(conn)
    children = facts.child_job_ids(conn)  # the workflows' steps and fan-outs' parts
    counts = Counter(outcome.status for job_id, outcome in found.items() if job_id in accepted)
    report.completed, report.cancelled, report.failed = (
        counts[Status.COMPLETED], counts[Status.CANCELLED], counts[Status.FAILED])
    report.failed_by_code = dict(Counter(outcome.error_code or "-" for job_id, outcome in found.items()
                                         if job_id in accepted and outcome.status == Status.FAILED))
    report.lost = sum(1 for job_id in accepted
                      if job_id not in found or found[job_id].status not in TERMINAL)
    report.rows_without_202 = sum(1 for job_id in found
                                  if job_id not in accepted and job_id not in children)
    # A child is cancelled by its parent, not by the client: judged with the workflows.
    report.cancelled_unasked = sum(1 for job_id, outcome in found.items()
                                   if outcome.status == Status.CANCELLED and job_id not in children
                                   and job_id not in tally.cancel_answer_of)
    report.cancel_answer_contradicted = sum(
        1 for job_id, said in tally.cancel_answer_of.items()
        if said == "200 cancelled" and (job_id not in found or found[job_id].status != Status.CANCELLED))
    report.still_leased = facts.still_leased(conn)
    report.attempts_histogram = facts.attempts_histogram(found, accepted)
    report.finished_twice = facts.finished_twice(conn)
    report.broken_event_chains = facts.broken_event_links(conn)
    report.status_disagrees_with_events = facts.status_disagrees_with_events(conn)
    report.relet_after_expiry, report.expired_by_sweeper = facts.expired_lease_takeovers(conn)
    report.resignalled_by_sweeper = facts.resignalled_by_sweeper(conn)
    return facts.worker_claims(conn)


def check_survivors(report: ChaosReport, restarts: list[Restart],
                    claims: list[tuple[str, datetime]]) -> None:
    """Every worker that was running when a server went down must claim again afterwards,
    in the same process tree: nobody restarted it."""
    by_pid: dict[int, list[float]] = {}
    for actor, at in claims:
        pid = actor.rsplit(":", 1)[-1]
        if pid.isdigit():
            by_pid.setdefault(int(pid), []).append(at.timestamp())
    for restart in restarts:
        resumed, unverified, delays = 0, 0, []
        for worker in restart.survivors:
            end = worker.ended or time.time()
            after = [t for pid in worker.pids for t in by_pid.get(pid, [])
                     if restart.ended <= t <= end and worker.started <= t]
            if after:
                resumed += 1
                delays.append(min(after) - restart.ended)
            elif worker.killed:
                unverified += 1  # killed by us before it had work again: nothing to conclude
            elif worker.ended is not None:
                report.survivors_not_resumed.append(
                    f"{worker.name} did not ride out the {restart.server} restart: it exited by "
                    f"itself {worker.ended - restart.began:+.1f} s from the start of the outage")
            else:
                report.survivors_not_resumed.append(
                    f"{worker.name} (pids {sorted(worker.pids)}) never claimed after the "
                    f"{restart.server} restart")
        note = (f"{restart.server} down {restart.ended - restart.began:.1f} s: "
                f"{resumed}/{len(restart.survivors)} workers running through it claimed again "
                f"without a restart")
        if delays:
            note += f" (first claim {min(delays):.1f} s after, slowest {max(delays):.1f} s)"
        if unverified:
            note += f"; {unverified} killed before they had work again"
        if restart.wakeups_dropped is not None:
            note += f"; {restart.wakeups_dropped} queued wake-ups died with it"
        report.restart_notes.append(note)


# ---------------------------------------------------------------------------------------------
# The invariants, in the order the report prints them
# ---------------------------------------------------------------------------------------------


def no_job_lost(r: ChaosReport) -> Verdict:
    return Verdict("no job lost", r.lost == 0 and not r.timed_out,
                   f"lost {r.lost} (accepted with no row, or not terminal at the end)")


def every_accepted_job_terminal(r: ChaosReport) -> Verdict:
    terminal = r.completed + r.cancelled + r.failed
    return Verdict("every accepted job terminal", terminal == r.accepted,
                   f"completed + cancelled + failed = {terminal}, accepted = {r.accepted}")


def no_job_finished_twice(r: ChaosReport) -> Verdict:
    return Verdict("no job finished twice", r.finished_twice == 0,
                   f"{r.finished_twice} jobs with more than one '-> completed' event")


def nothing_still_leased(r: ChaosReport) -> Verdict:
    return Verdict("nothing still leased", r.still_leased == 0, f"{r.still_leased} rows leased")


def quota_counts_exact(r: ChaosReport) -> Verdict:
    return Verdict("quota counts exact", r.active_counts_off == 0,
                   f"{r.active_counts_off} (organization, kind) pairs whose active count is off")


def event_chains_consistent(r: ChaosReport) -> Verdict:
    return Verdict("event chains consistent",
                   r.broken_event_chains == 0 and r.status_disagrees_with_events == 0,
                   f"{r.broken_event_chains} events whose from_status is not the previous to_status; "
                   f"{r.status_disagrees_with_events} rows whose status is not their last event")


def cancels_keep_their_word(r: ChaosReport) -> Verdict:
    return Verdict("cancels keep their word",
                   r.cancelled_unasked == 0 and r.cancel_answer_contradicted == 0,
                   f"{r.cancelled_unasked} jobs cancelled that nobody cancelled; "
                   f"{r.cancel_answer_contradicted} answered '200 cancelled' but not cancelled")


def only_legitimate_answers(r: ChaosReport) -> Verdict:
    return Verdict("only legitimate answers", not r.unexpected_answers,
                   f"{len(r.unexpected_answers)} answers other than 202/503 (submit) and "
                   "200/202/409/503 (cancel)")


def workers_and_beat_ride_out_restarts(r: ChaosReport) -> Verdict:
    return Verdict("workers and beat ride out restarts",
                   not r.survivors_not_resumed and not r.unexpected_exits,
                   f"{len(r.survivors_not_resumed)} workers did not claim again after a restart; "
                   f"{len(r.unexpected_exits)} processes died without being killed")


def beat_rides_out_restarts(r: ChaosReport) -> Verdict:
    sent = r.beat_sweeps_after_last_restart
    return Verdict("beat rides out restarts", sent is None or sent > 0,
                   "no server restart in this run" if sent is None
                   else f"{sent} ticks of beat's sweep chores after the last server restart")


def every_workflow_ends_once(r: ChaosReport) -> Verdict:
    c = r.composites
    return Verdict("every workflow ends once",
                   c.parents_not_terminal == 0 and c.parents_terminal_events_off == 0
                   and c.parents_with_active_steps == 0,
                   f"{sum(c.parents.values())} workflows and fan-outs: {c.parents_not_terminal} not "
                   f"terminal, {c.parents_terminal_events_off} with other than one terminal event, "
                   f"{c.parents_with_active_steps} with a step still active")


def step_results_recorded_once(r: ChaosReport) -> Verdict:
    c = r.composites
    off = (c.places_with_two_children + c.children_completed_twice
           + c.completed_parents_missing_steps + c.results_not_the_steps + c.draws_not_recorded_once)
    return Verdict("every step's result recorded once", off == 0,
                   f"{sum(c.steps.values())} steps: {c.places_with_two_children} places with two "
                   f"children, {c.children_completed_twice} completed twice, "
                   f"{c.completed_parents_missing_steps} completed workflows without one completed "
                   f"step per place, {c.results_not_the_steps} results not their steps', "
                   f"{c.draws_not_recorded_once} fan-out draws not the recorded step")


def no_step_after_cancel(r: ChaosReport) -> Verdict:
    c = r.composites
    return Verdict("no step starts after its workflow's cancel",
                   not c.started_after_cancel and c.steps_cancelled_alone == 0,
                   f"{c.cancelled_parents} workflows cancelled: {len(c.started_after_cancel)} steps "
                   f"leased or created after the cancel took effect; {c.steps_cancelled_alone} steps "
                   "cancelled while their workflow went on")


def no_wait_left_with_its_condition_met(r: ChaosReport) -> Verdict:
    c = r.composites
    return Verdict("no job left waiting with its condition met",
                   c.waits_met_seen == 0 and c.waits_met_at_end == 0,
                   f"at most {c.waits_met_seen} in {c.waits_met_readings} readings during the run, "
                   f"{c.waits_met_at_end} at the end (a timer {TIMER_SLACK_SECONDS:g} s past due, an "
                   "untaken signal it waits for, its children settled)")


def timers_never_early(r: ChaosReport) -> Verdict:
    c = r.composites
    return Verdict("timers never fire early", c.timers_early == 0,
                   f"{c.timers_early} of {c.timers_completed} bench.wait completed before the moment "
                   "their first run recorded")


def signals_taken_once(r: ChaosReport) -> Verdict:
    c = r.composites
    return Verdict("each signal taken once, by its wait",
                   c.signals_taken_wrong == 0 and c.signal_results_wrong == 0,
                   f"{sum(c.signal_jobs.values())} signal jobs: {c.signals_taken_wrong} took other than "
                   f"one signal, {c.signal_results_wrong} completed without the payload sent to them")


def run_completed(r: ChaosReport) -> Verdict:
    return Verdict("run completed", r.error is None, r.error or "no error")


INVARIANTS = (no_job_lost, every_accepted_job_terminal, no_job_finished_twice, nothing_still_leased,
              quota_counts_exact, event_chains_consistent, cancels_keep_their_word, only_legitimate_answers,
              workers_and_beat_ride_out_restarts, beat_rides_out_restarts, every_workflow_ends_once,
              step_results_recorded_once, no_step_after_cancel, no_wait_left_with_its_condition_met,
              timers_never_early, signals_taken_once, run_completed)


def every_cut_made(r: ChaosReport) -> Verdict:
    return Verdict("every planned cut made", len(r.cut_findings) == r.cuts_planned,
                   f"{len(r.cut_findings)} of {r.cuts_planned} cuts made and healed")


def cut_hosts_work_again(r: ChaosReport) -> Verdict:
    workers = [f for f in r.cut_findings if not f.is_web]
    back = [f.first_claim_after for f in workers if f.first_claim_after is not None]
    detail = (f"{len(back)} of {len(workers)} cut worker hosts claimed again after the heal, in the "
              "process that was cut")
    if back:
        detail += f" (the slowest {max(back):.1f} s after)"
    return Verdict("cut hosts work again after the heal", len(back) == len(workers), detail)


def pg_cut_jobs_taken_over(r: ChaosReport) -> Verdict:
    cut = [f for f in r.cut_findings if "PostgreSQL" in f.servers]
    held = sum(f.held for f in cut)
    taken = sum(f.taken_over for f in cut)
    fenced = sum(sum(f.stale) for f in cut)
    probed = [f for f in cut if f.held_probe]
    return Verdict("a host cut from PostgreSQL loses its jobs to others, and its late writes to the fence",
                   taken == held and bool(probed) and all(sum(f.stale) > 0 for f in probed),
                   f"{len(cut)} cuts: {taken} of the {held} leases held at a cut taken over during it; "
                   f"{len(probed)} cut holding a probe; {fenced} stale finishes, heartbeats or "
                   "failures fenced after the heals")


def redis_cut_hosts_keep_claiming(r: ChaosReport) -> Verdict:
    cut = [f for f in r.cut_findings if not f.is_web and f.servers == ["Redis"]]
    return Verdict("a worker cut from Redis alone keeps running jobs",
                   all(f.claims_during > 0 for f in cut),
                   ", ".join(f"{f.host}: {f.claims_during} claims while cut" for f in cut) or "no such cut")


def web_cut_from_redis_accepts(r: ChaosReport) -> Verdict:
    cut = [f for f in r.cut_findings if f.is_web]
    ok = all(f.submits_during[1] > 0 and f.submits_during[0] == f.submits_during[1] for f in cut)
    return Verdict("the web cut from Redis accepts every submit", bool(cut) and ok,
                   ", ".join(f"{f.submits_during[1]} of {f.submits_during[0]} accepted while cut"
                             for f in cut) or "no such cut")


PARTITION_INVARIANTS = (every_cut_made, cut_hosts_work_again, pg_cut_jobs_taken_over,
                        redis_cut_hosts_keep_claiming, web_cut_from_redis_accepts)


def judge(report: ChaosReport) -> list[Verdict]:
    extra = PARTITION_INVARIANTS if report.partitions else ()
    return [invariant(report) for invariant in (*INVARIANTS, *extra)]
