"""What a person reads about a job: one sentence per state, in words (never colour alone).

They must always understand what happened: accepted is not done; a retry is the same job, not
a new one; a cancel request is not yet a cancellation; a failure says what to do next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import UUID

from spacejobs.models.jobs.holds import Reason, Waiting
from spacejobs.models.jobs.records import ACTIVE, Job, Status
from spacejobs.models.kinds import label_of as label_of  # the pages name kinds by it

if TYPE_CHECKING:
    from spacejobs.models.jobs.store import Steps

# What to do after a failure, by error code; anything else: try again, then contact support.
NEXT_STEPS = {
    "requester_not_member": "The person who started it is no longer a member. "
                            "Ask a member of the organization to start it again.",
    "insufficient_role": "Ask an admin or an owner of the organization to start it.",
    "organization_read_only": "The organization is read-only. Ask an owner to make it active "
                              "again, then start a new job.",
    "organization_unavailable": "The organization is no longer available for this.",
    "invalid_params": "Correct the file, then start a new import.",
    "result_not_storable": "Its result could not be kept, and a new job would fail the same way: "
                           "contact support and quote {quote}.",
    "children_failed": "Open its failed parts below to see why each failed, then start a new job.",
    "steps_failed": "Open its failed steps below to see why each failed, then start a new job.",
    "signal_timeout": "Nobody answered in time. Start a new job and answer it before its deadline.",
}
#: the failures of the machinery, not of the job's input: a new job may well succeed
TRANSIENT = frozenset({"internal_error", "lease_expired", "timed_out", "unavailable"})
TRY_AGAIN = "Try again with a new job. If it fails again, contact support and quote {quote}."
#: any other code is the kind's own (a DomainError, permanent unless it says otherwise): its
#: message names what is wrong, and the same input would fail the same way
FIX_FIRST = ("The message above says what is wrong: a new job with the same input would fail the "
             "same way. Change what it names, then start a new job.")


def next_step(code: str | None, request_id: str | None) -> str:
    """What to do after a failure with this error code; ``request_id``: the one to quote (a job
    submitted from Python or a script has none: its job id is quoted instead)."""
    quote = "the request id" if request_id else "the job id"
    if code in NEXT_STEPS:
        return NEXT_STEPS[code].format(quote=quote)
    return TRY_AGAIN.format(quote=quote) if code is None or code in TRANSIENT else FIX_FIRST


@dataclass(frozen=True)
class Shown:
    word: str  # a short status for tables
    headline: str  # the state, as the live page shows it
    detail: str | None = None
    progress: tuple[int, int] | None = None  # (done, total): a bar only when a total was measured
    next_step: str | None = None
    tone: str = "neutral"  # a CSS class; the words above always say it all


def running_line(job: Job) -> tuple[str, tuple[int, int] | None]:
    """``Running — <stage> <done>/<total>``, from what the job measured (nothing invented)."""
    progress = job.progress or {}
    stage, done, total = progress.get("stage"), progress.get("done"), progress.get("total")
    if not stage:
        return "Running — started", None
    if isinstance(done, int) and isinstance(total, int) and total > 0:
        return f"Running — {stage} {done}/{total}", (min(done, total), total)
    if isinstance(done, int) and isinstance(total, int):
        return f"Running — {stage} {done}/{total}", None
    return f"Running — {stage}", None


def moment(when: datetime, now: datetime) -> str:
    """``14:05:10 UTC`` today, ``2026-12-03 14:05:10 UTC`` on any other day (both in UTC)."""
    when, today = when.astimezone(UTC), now.astimezone(UTC).date()
    return when.strftime("%H:%M:%S UTC" if when.date() == today else "%Y-%m-%d %H:%M:%S UTC")


# What the job's children are called, by the stage a parent reports before it waits for them:
# a fan-out's (tasks/engine/fanout.py) and a workflow's (models/jobs/canvas.py).
CHILDREN_STAGES = {"children": "parts", "steps": "steps"}


def children_done(job: Job) -> tuple[str, tuple[int, int] | None]:
    """What a parent's children are called, and (done, total) as the parent last measured them."""
    progress = job.progress or {}
    stage, done, total = progress.get("stage"), progress.get("done"), progress.get("total")
    called = CHILDREN_STAGES.get(stage) if isinstance(stage, str) else None  # progress is JSON
    if called and isinstance(done, int) and isinstance(total, int) and 0 <= done <= total \
            and total > 0:
        return called, (done, total)
    return called or "parts", None


def waiting_line(job: Job, now: datetime) -> tuple[str, str, tuple[int, int] | None]:
    """What a waiting job waits for, in words: the headline, what happens next, and a bar for
    a parent's children. A signal's name is the kind's own word, shown as it is."""
    meanwhile = "It holds no worker while it waits"
    if job.wait_signal is not None:
        by = f", or at {moment(job.wait_until, now)} at the latest" if job.wait_until else ""
        return (f"Waiting for the signal “{job.wait_signal}”",
                f"{meanwhile}, and carries on by itself when the signal comes{by}.", None)
    if job.wait_children is not None:
        called, measured = children_done(job)
        then = f"{meanwhile}, and carries on by itself as its {called} finish."
        if measured:
            done, total = measured
            return f"Waiting for its {called}: {done} of {total} done", then, measured
        return f"Waiting for its {called}", then, None
    if job.wait_until is not None:
        return (f"Waiting until {moment(job.wait_until, now)}",
                f"{meanwhile}, and carries on by itself at that moment.", None)
    return "Waiting", f"{meanwhile}.", None  # the schema forbids this; say no more than known


def waiting_words(why: Waiting, now: datetime | None = None) -> str:
    """Why a job waits, in one sentence (models.jobs.holds.why_waiting: the JSON's
    ``waiting_reason.words``, the job page's headline, the operators' dashboard)."""
    now = now or datetime.now(UTC)
    at = moment(why.until, now) if why.until else None
    if why.reason == Reason.SEQUENCE:
        return f"Queued behind job {str(why.behind)[:8]} of its sequence, until it has ended"
    if why.reason == Reason.DELAYED:
        return f"Queued until {at}: its start was put off"
    if why.reason == Reason.RATE_LIMIT:
        return f"Queued behind its kind's rate limit until {at}"
    if why.reason == Reason.SIGNAL:
        by = f", or until {at} at the latest" if at else ""
        return f"Waiting for the signal “{why.signal}”{by}"
    if why.reason == Reason.CHILDREN:
        return "Waiting for its children to finish"
    return f"Waiting until {at}"


def queued_line(why: Waiting, now: datetime) -> tuple[str, str]:
    """A queued job held back, as its page says it: the headline and what happens next."""
    at = moment(why.until, now) if why.until else ""
    if why.reason == Reason.SEQUENCE:
        return (f"Queued — after job {str(why.behind)[:8]} of its sequence",
                "Jobs of a sequence run one at a time, in the order they were submitted: this "
                "one starts by itself once the job before it has ended.")
    if why.reason == Reason.RATE_LIMIT:
        return (f"Queued — behind a rate limit until {at}",
                "As many jobs of this kind as its rate limit lets start in this organization "
                f"have started in the last window; this one starts by itself at {at} or soon "
                "after.")
    return (f"Queued — delayed until {at}",
            f"Its start was put off until then; it starts by itself at {at} or soon after.")


def short_status(status: Status, attempts: int) -> tuple[str, str]:
    """A job's status as a word and a tone (a CSS class): a list of steps shows these, and
    :func:`describe` gives them to the whole job."""
    if status == Status.WAITING:
        return "Waiting", "waiting"
    if status == Status.QUEUED:
        return ("Queued" if attempts == 0 else "Retrying"), "waiting"
    if status == Status.LEASED:
        return ("Running" if attempts <= 1 else "Retrying"), "running"
    if status == Status.CANCEL_REQUESTED:
        return "Cancel requested", "running"
    if status == Status.CANCELLED:
        return "Cancelled", "neutral"
    if status == Status.COMPLETED:
        return "Completed", "good"
    return "Failed", "bad"


#: a workflow's step that is no job yet: its dependencies have not all completed (while the
#: workflow goes on), or it never will run (the workflow ended: failed, cancelled or skipped)
NOT_STARTED = ("Not started", "neutral")
SKIPPED = ("Skipped", "neutral")


@dataclass(frozen=True)
class StepLine:
    """One line of a parent job's list of steps, in words: what it is called, its kind, its
    status (word, tone, and the status for the pill's class), the child job to link to (None:
    no job yet) and, when it failed, its error code. Nothing else of the step is shown."""

    name: str
    kind: str
    word: str
    tone: str
    status: str
    job_id: UUID | None
    error_code: str | None


@dataclass(frozen=True)
class StepList:
    """A parent job's steps as its page lists them. ``live``: some may still move, so the page
    fetches its status part again now and then (a step that starts or progresses changes
    nothing of its parent, so the parent's events stream does not tell)."""

    called: str  # "steps" (a workflow's) or "parts" (a fan-out's)
    lines: list[StepLine]
    more: int
    live: bool


def step_list(parent: Job, steps: Steps) -> StepList:
    """A workflow's steps by name; any other parent's parts as ``#1``, ``#2``… (with their
    kind), each status in the words and tone :func:`describe` gives a whole job."""
    workflow = parent.kind == "workflow"
    lines = []
    for step in steps.rows:
        if step.status is None:
            word, tone = SKIPPED if parent.finished else NOT_STARTED
        else:
            word, tone = short_status(step.status, step.attempts)
        lines.append(StepLine(
            name=step.name if workflow and step.name else f"#{step.place + 1}", kind=step.kind,
            word=word, tone=tone, status=str(step.status) if step.status else "none",
            job_id=step.job_id,
            error_code=step.error_code if step.status == Status.FAILED else None))
    moving = any(step.status in ACTIVE for step in steps.rows)
    # Called as the headline calls them: a kind's own workflow (ctx.workflow) reports "steps".
    called = "steps" if workflow else children_done(parent)[0]
    return StepList(called, lines, steps.more, bool(lines) and (moving or not parent.finished))


def attempt_number(job: Job) -> int | None:
    """The attempt the job is in, or begins next when it is queued after running (None: it
    has not started): see :func:`attempt_line`."""
    if job.started_at is None:
        return None
    return job.attempts + 1 if job.status == Status.QUEUED else job.attempts


def attempt_line(job: Job) -> str:
    """Which attempt the job is in, out of how many it may take, as its page's facts say it.

    ``jobs.attempts`` counts the attempts begun: a running, waiting or ended job's is the
    attempt it is (or was last) in, a wait using none up. A queued job that ran before (a retry,
    or a resume after a wait) holds one less than the attempt it begins or goes on with next.
    A workflow's own attempts are only those of its short runs that start its steps and
    collect their results; each step has its own, on its own page."""
    current = attempt_number(job)
    if current is None:
        line = f"none yet (at most {job.max_attempts})"
    elif job.status == Status.QUEUED:
        line = f"{current} of {job.max_attempts}, next"
    else:
        line = f"{current} of {job.max_attempts}"
    if job.status == Status.WAITING:
        line += ", waiting (a wait uses no attempt up)"
    if job.kind == "workflow":
        line += "; the workflow's own, to start and collect its steps: each step has its own"
    return line


def describe(job: Job, now: datetime | None = None, request_id: str | None = None,
             held: Waiting | None = None) -> Shown:
    """``now``: the moment the page is shown (a moment later today is written without its date);
    ``request_id``: the request that submitted it, for a failure's next step to quote;
    ``held``: why a queued job waits (models.jobs.holds.why_waiting), if anything holds it.
    The word and the tone are :func:`short_status`'s, as a list of steps shows them."""
    status = job.status
    word, tone = short_status(status, job.attempts)
    if status == Status.WAITING:
        headline, detail, bar = waiting_line(job, now or datetime.now(UTC))
        return Shown(word, headline, detail, bar, tone=tone)
    if status == Status.QUEUED and held is not None and job.attempts == 0:
        headline, detail = queued_line(held, now or datetime.now(UTC))
        return Shown(word, headline, detail, tone=tone)
    if status == Status.QUEUED and job.attempts == 0 and job.started_at is not None:
        # it ran, and gave its first attempt back to go on with it (after a wait, or a worker
        # that shut down): no attempt failed
        return Shown(word, "Queued — it goes on shortly, in the same attempt", tone=tone)
    if status == Status.QUEUED and job.attempts == 0:
        return Shown(word, "Queued — accepted, not started yet", tone=tone)
    if status == Status.QUEUED:
        reason = f" ({job.error_message})" if job.error_message else ""
        when = "shortly"
        if held is not None and held.until is not None:
            when = f"at {moment(held.until, now or datetime.now(UTC))} or soon after"
        elif held is not None:
            when = queued_line(held, now or datetime.now(UTC))[0].removeprefix("Queued — ")
        return Shown(word, f"Retrying — attempt {job.attempts + 1} of {job.max_attempts}",
                     f"Attempt {job.attempts} did not succeed{reason}. It will run again {when}: "
                     "the same job, with the same id.", tone=tone)
    if status == Status.LEASED:
        line, bar = running_line(job)
        if job.attempts > 1:
            return Shown(word, f"Retrying — attempt {job.attempts} of {job.max_attempts}",
                         line + " (the same job, with the same id)", bar, tone=tone)
        return Shown(word, line, None, bar, tone=tone)
    if status == Status.CANCEL_REQUESTED:
        line, _bar = running_line(job)  # no bar: the job is winding down, not getting on
        return Shown(word, "Cancel requested",
                     "The job stops at its next safe point; until then it is still running "
                     f"({line.removeprefix('Running — ')}).", tone=tone)
    if status == Status.CANCELLED:
        return Shown(word, "Cancelled", "The job was stopped and will not run again.", tone=tone)
    if status == Status.COMPLETED:
        return Shown(word, "Completed", tone=tone)
    return Shown(word, "Failed", job.error_message or "The job failed.",
                 next_step=next_step(job.error_code, request_id), tone=tone)
