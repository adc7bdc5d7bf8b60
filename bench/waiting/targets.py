"""Issue 16's "Measured" targets, one line each with its figure and PASS or FALL SHORT."""

from __future__ import annotations

from bench.harness import percentile
from bench.waiting.figures import (
    BURST_JOB,
    CANCEL_CHILD_SECONDS,
    CHAIN_STEP,
    FAN_KIND,
    GROUP_STEP,
    RECOVERY,
    CancelFigure,
    ChainFigure,
    DrainFigure,
    GroupFigure,
    SlotsFigure,
    TimerFigure,
    median,
)

#: the most a timer may fire late, at p95
LATENESS_P95 = 1.0
#: a fan-out's drain against the plain drain of as many jobs
FAN_OUT_SHARE = 0.8
#: the most a chain's step may cost beyond its own work, in seconds
CHAIN_STEP_OVERHEAD = 0.005
#: the most a group of two steps may take beyond one step's work, on two free slots (issue 31:
#: two 4 s steps in at most 4.5 s)
GROUP_ROOM = 0.5
#: the most seconds from a workflow's cancel to its running grandchild's end (issue 31)
CANCEL_REACH = 1.0
#: CPU within noise of idle: at most the highest idle reading plus this (percent of one core),
#: or plus the idle readings' own range when that is wider. psutil reads CPU time in clock ticks
#: (10 ms), so over a reading of a few seconds a quiet process already varies by a few tenths.
CPU_FLOOR = 0.5


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FALL SHORT"


def _percent(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}%"


def slots_lines(figure: SlotsFigure) -> list[str]:
    timers = figure.jobs // 2
    head = (f"issue 16 slots: {figure.jobs:,} jobs waiting ({timers:,} on timers,"
            f" {figure.jobs - timers:,} on signals) hold 0 leases")
    held = (f"{head}: at most {figure.most_holding_a_lease} in {figure.lease_readings} readings,"
            f" {figure.still_waiting:,} still waiting at the end"
            f" {verdict(figure.most_holding_a_lease == 0 and figure.still_waiting == figure.jobs)}")
    allowed = max(figure.idle) + max(CPU_FLOOR, max(figure.idle) - min(figure.idle))
    waiting = median(figure.waiting)
    cpu = (f"issue 16 slots: the workers' CPU with {figure.jobs:,} jobs waiting is within noise of"
           f" idle (median <= idle max + max({CPU_FLOOR:g}, idle range)): {waiting:.2f}% of a core"
           f" (each {_percent(figure.waiting)}) vs idle {median(figure.idle):.2f}%"
           f" (each {_percent(figure.idle)}), allowed {allowed:.2f}% {verdict(waiting <= allowed)}")
    return [held, cpu]


def timer_line(figure: TimerFigure, sweep_interval: float, timer_interval: float) -> str:
    when = ("due in the same second" if figure.spread == 0
            else f"spread over {figure.spread:g} s")
    redis = "Redis running" if figure.redis_running else "Redis stopped"
    head = (f"issue 16 timers: {figure.count} {when}, {redis}, fire <= {LATENESS_P95:g} s late"
            f" at p95 (SPACEJOBS_TIMER_INTERVAL={timer_interval:g} s,"
            f" SPACEJOBS_SWEEP_INTERVAL={sweep_interval:g} s)")
    completed = [t.completed_after for t in figure.timers if t.completed_after is not None]
    resumed = [t.resumed_after for t in figure.timers if t.resumed_after is not None]
    waited = sum(t.waited for t in figure.timers)
    missing = figure.count - len(completed)
    facts = [f"{waited} of {figure.count} waited"]
    if resumed:
        facts.append(f"resumed (waiting > queued) p95 {percentile(resumed, 95):.2f} s")
    else:
        facts.append("none resumed")
    leased = [t.leased_after for t in figure.timers if t.leased_after is not None]
    if leased:
        facts.append(f"leased again p95 {percentile(leased, 95):.2f} s")
    if not figure.redis_running:
        facts.append(f"all completed {figure.recovered_in:.1f} s after Redis came back"
                     if figure.recovered_in is not None else
                     f"not completed {RECOVERY:g} s after Redis came back: the workers were"
                     " replaced" if figure.workers_replaced else "not completed")
    if missing:
        done = (f"; those done: p50 {percentile(completed, 50):.2f} s, max {max(completed):.2f} s"
                if completed else "")
        return (f"{head}: {missing} of {figure.count} not completed within {figure.patience:g} s"
                f" of the last due moment{done} ({', '.join(facts)}) FALL SHORT")
    p95 = percentile(completed, 95)
    return (f"{head}: completion p95 {p95:.2f} s (p50 {percentile(completed, 50):.2f}, max"
            f" {max(completed):.2f}; {', '.join(facts)}) {verdict(p95 <= LATENESS_P95)}")


def fan_out_line(fans: list[DrainFigure], plains: list[DrainFigure], max_parallel: int) -> str:
    children = fans[0].jobs if fans else plains[0].jobs if plains else 0
    head = (f"issue 16 fan-out: {children:,} children, max_parallel {max_parallel}, drain >="
            f" {FAN_OUT_SHARE:g}x a plain drain of {children:,} bench.noop")
    if not (fans and plains):
        return f"{head}: not measured"
    fan = median([f.rate for f in fans])
    plain = median([p.rate for p in plains])
    each = ", ".join(f"{f.rate:,.0f}/{p.rate:,.0f}" for f, p in zip(fans, plains, strict=False))
    return (f"{head}: {fan / plain:.2f}x ({fan:,.0f} vs {plain:,.0f} jobs/s, medians of"
            f" {len(fans)}; each fan/plain {each}) {verdict(fan >= FAN_OUT_SHARE * plain)}")


def chain_line(chains: list[ChainFigure], steps: int) -> str:
    head = (f"issue 16 chain: {steps} steps of {CHAIN_STEP}, <= {1000 * CHAIN_STEP_OVERHEAD:g} ms"
            " per step beyond the steps' own work")
    if not chains:
        return f"{head}: not measured"
    each = [c.overhead_per_step for c in chains]
    per_step = median(each)
    facts = ", ".join(f"{1000 * c.overhead_per_step:.1f} ms ({c.seconds:.2f} s submit -> completion,"
                      f" {c.work:.2f} s of the steps' work, {c.runs} runs of the workflow)"
                      for c in chains)
    return (f"{head}: {1000 * per_step:.1f} ms per step (median of {len(chains)}; each {facts})"
            f" {verdict(per_step <= CHAIN_STEP_OVERHEAD)}")


def group_line(groups: list[GroupFigure], step_seconds: float, burst: int, slots: str) -> str:
    head = (f"issue 31 group: two {step_seconds:g} s {GROUP_STEP} steps take <="
            f" {step_seconds + GROUP_ROOM:g} s from the submit to the completion on {slots}"
            f" after a burst of {burst:,} {BURST_JOB}")
    if not groups:
        return f"{head}: not measured"
    seconds = median([g.seconds for g in groups])
    facts = ", ".join(f"{g.seconds:.2f} s (the steps {g.steps_seconds:.2f} s, {g.given_back} given"
                      " back)" for g in groups)
    return (f"{head}: {seconds:.2f} s (median of {len(groups)}; each {facts})"
            f" {verdict(seconds <= step_seconds + GROUP_ROOM)}")


def cancel_line(cancels: list[CancelFigure]) -> str:
    head = (f"issue 31 cancel: a workflow's cancel reaches its running grandchild (a"
            f" {CANCEL_CHILD_SECONDS:g} s bench.sleep under a {FAN_KIND} step) within"
            f" {CANCEL_REACH:g} s")
    if not cancels:
        return f"{head}: not measured"
    seconds = median([c.seconds for c in cancels])
    facts = ", ".join(f"{c.seconds:.2f} s after {c.ran:g} s of its run" for c in cancels)
    return (f"{head}: {seconds:.2f} s (median of {len(cancels)}; each {facts})"
            f" {verdict(seconds <= CANCEL_REACH)}")
