"""spacejobs.testing's in-memory mode: a kind's own function with the engine's own JobContext
over a runtime in memory. Steps are recorded and replayed, progress recorded, signals sent
before or after a wait are taken in order, sleeps and signal waits end a run waiting (the
engine's WaitRequested) until time is moved or the signal comes, and a fan-out's or a
workflow's children run in memory too."""

from __future__ import annotations

import math
import time
from typing import Any, Literal

import pytest

from spacejobs import testing
from spacejobs.models.errors import (
    DomainError,
    InvalidParams,
    ResultNotStorable,
    SignalTimeout,
    WaitRequested,
)
from spacejobs.models.jobs.canvas import chain, graph, group, sig
from spacejobs.models.jobs.records import Status
from spacejobs.models.kinds import NoParams, Params, job_kind
from spacejobs.tasks.engine.context import JobContext
from spacejobs.tasks.engine.fanout import ChildrenFailed
from spacejobs.tasks.engine.workflows import StepsFailed
from spacejobs.testing import AttemptOutcome as Outcome
from spacejobs.testing import MemoryJob, NotCompleted, SentSignal, run_in_memory

#: what the kinds below did outside their steps' records (a step must run once per job)
DONE: list[str] = []


@pytest.fixture(autouse=True)
def _forget() -> None:
    DONE.clear()


class GreetParams(Params):
    name: str
    times: int = 1


@job_kind("unit.memory.greet", org_states={"active"})
def greet(ctx: JobContext, params: GreetParams) -> dict[str, Any]:
    ctx.progress("greeting", done=0, total=params.times)
    words = [f"hello {params.name}"] * params.times
    ctx.progress("greeting", done=params.times, total=params.times)
    return {"words": words}


class NapParams(Params):
    seconds: float = 60


@job_kind("unit.memory.nap", org_states={"active"})
def nap(ctx: JobContext, params: NapParams) -> dict[str, Any]:
    """A step, a durable sleep, another step: each step runs once whatever the runs."""
    before = ctx.step("before", lambda: DONE.append("before") or ("a", "tuple"))
    ctx.sleep(params.seconds)
    after = ctx.step("after", lambda: DONE.append("after") or 2)
    return {"before": before, "after": after}


class ApproveParams(Params):
    timeout: float = 3600


@job_kind("unit.memory.approve", org_states={"active"})
def approve(ctx: JobContext, params: ApproveParams) -> dict[str, Any]:
    """Takes approvals until an admin's comes; answers each sender's role it saw."""
    seen = []
    while True:
        signal = ctx.receive_signal("approve", timeout=params.timeout)
        seen.append(signal.sender_role)
        if signal.sender_role in ("admin", "owner"):
            return {"payload": signal.payload, "roles": seen}


@job_kind("unit.memory.go", org_states={"active"})
def go(ctx: JobContext, params: NoParams) -> Any:
    return ctx.wait_for_signal("go", timeout=60)


@job_kind("unit.memory.part", org_states={"active"}, child_only=True)
def part(ctx: JobContext, params: GreetParams) -> str:
    if params.name == "boom":
        raise PartRefused()
    return params.name.upper() * params.times


class PartRefused(DomainError):
    code = "part_refused"
    message = "This part refuses."


class FanParams(Params):
    names: list[str]


@job_kind("unit.memory.fan", org_states={"active"})
def fan(ctx: JobContext, params: FanParams) -> list[Any]:
    return ctx.fan_out("unit.memory.part", [{"name": n} for n in params.names], max_parallel=2)


class AddParams(Params):
    n: int


@job_kind("unit.memory.add", org_states={"active"})
def add(ctx: JobContext, params: AddParams) -> int:
    return sum(ctx.inputs) + params.n


@job_kind("unit.memory.flow", org_states={"active"})
def flow(ctx: JobContext, params: NoParams) -> dict[str, Any]:
    return ctx.workflow(chain(sig("unit.memory.add", name="one", n=1),
                              sig("unit.memory.add", name="two", n=10),
                              sig("unit.memory.add", name="three", n=100)))


class FirstParams(Params):
    first: Literal["unit.memory.add", "unit.memory.refuse"]


@job_kind("unit.memory.flow_across_empty", org_states={"active"})
def flow_across_empty(ctx: JobContext, params: FirstParams) -> dict[str, Any]:
    first = sig(params.first, name="one", n=1) if params.first == "unit.memory.add" else sig(
        params.first, name="one")
    return ctx.workflow(chain(first, group(), sig("unit.memory.add", name="after", n=10)),
                        policy="run_all")


@job_kind("unit.memory.refuse", org_states={"active"}, child_only=True)
def refuse(ctx: JobContext, params: NoParams) -> None:
    raise PartRefused()


class PolicyParams(Params):
    policy: Literal["fail_fast", "run_all"]


@job_kind("unit.memory.flow_fails", org_states={"active"})
def flow_fails(ctx: JobContext, params: PolicyParams) -> dict[str, Any]:
    return ctx.workflow(graph({"a": (sig("unit.memory.add", n=1), []),
                               "refused": (sig("unit.memory.refuse"), []),
                               "b": (sig("unit.memory.add", n=2), ["a"]),
                               "after": (sig("unit.memory.add", n=3), ["refused"])}),
                        policy=params.policy)


class Flaky(DomainError):
    code = "flaky"
    message = "Try again."
    permanent = False


class FlakyParams(Params):
    bug: bool = False


@job_kind("unit.memory.flaky", org_states={"active"}, max_attempts=3)
def flaky(ctx: JobContext, params: FlakyParams) -> int:
    if ctx.job.attempt == 1:
        raise RuntimeError("a bug") if params.bug else Flaky()
    return ctx.job.attempt


@job_kind("unit.memory.tenant", org_states={"active"})
def reads_the_tenant(ctx: JobContext, params: NoParams) -> str:
    with ctx.tenant() as tenant:
        return str(tenant.conn.fetch(tenant.organization_id))


@job_kind("unit.memory.nan", org_states={"active"})
def returns_nan(ctx: JobContext, params: NoParams) -> float:
    return math.nan


# -- a kind's result -------------------------------------------------------------------------

def test_a_kind_runs_to_its_result_by_its_name_or_its_function_with_validated_params():
    assert run_in_memory(greet, {"name": "Vera", "times": 2}) == {"words": ["hello Vera"] * 2}
    assert run_in_memory("unit.memory.greet", GreetParams(name="Anna")) == {"words": ["hello Anna"]}
    with pytest.raises(InvalidParams):
        run_in_memory(greet, {"name": "Vera", "colour": "red"})  # as a submit refuses them


def test_progress_is_recorded_in_order():
    job = MemoryJob(greet, {"name": "Vera", "times": 3})
    assert job.run() == Outcome.COMPLETED
    assert job.progress == [{"stage": "greeting", "done": 0, "total": 3},
                            {"stage": "greeting", "done": 3, "total": 3}]
    assert (job.status, job.result) == (Status.COMPLETED, {"words": ["hello Vera"] * 3})


def test_a_function_that_is_not_a_kind_is_refused_by_name():
    def not_a_kind(ctx: JobContext, params: NoParams) -> None:
        return None

    with pytest.raises(LookupError, match="not a registered kind"):
        run_in_memory(not_a_kind)


def test_a_result_postgresql_could_not_store_fails_as_on_a_worker():
    with pytest.raises(ResultNotStorable):
        run_in_memory(returns_nan)


# -- steps and sleeps ------------------------------------------------------------------------

def test_a_sleep_ends_the_run_waiting_and_its_steps_are_replayed_once_time_moved():
    job = MemoryJob(nap, {"seconds": 60})
    assert job.run() == Outcome.WAITING
    assert job.status == Status.WAITING and isinstance(job.waits_for, WaitRequested)
    assert set(job.steps) == {"before", "sleep#1"}
    with pytest.raises(testing.NotDue, match="advance"):
        job.run()

    assert job.advance(59) == Status.WAITING
    assert job.advance(2) == Status.QUEUED
    assert job.run() == Outcome.COMPLETED
    # The first step's value as the database returns it (JSON: the tuple comes back a list),
    # and each step ran once across the two runs.
    assert job.result == {"before": ["a", "tuple"], "after": 2}
    assert DONE == ["before", "after"]
    assert [r.outcome for r in job.runs] == ["waiting", "completed"]


def test_a_moment_that_passed_by_itself_needs_no_advance_and_time_never_goes_back():
    # Half a second: long enough that a loaded machine's first run has not passed the moment
    # already (at 10 ms, a full suite's run once did, and the job completed in one run).
    job = MemoryJob(nap, {"seconds": 0.5})
    assert job.run() == Outcome.WAITING
    time.sleep(0.6)
    assert job.run() == Outcome.COMPLETED
    with pytest.raises(ValueError, match="forward"):
        MemoryJob(nap).advance(-1)


def test_run_until_done_sleeps_at_once():
    assert run_in_memory(nap, {"seconds": 86400}) == {"before": ["a", "tuple"], "after": 2}
    assert DONE == ["before", "after"]


def test_a_context_of_its_own_raises_the_engines_wait():
    job = MemoryJob(nap)
    with pytest.raises(WaitRequested) as waits:
        nap(job.context(), NapParams())
    assert waits.value.until is not None and waits.value.signal is None


# -- signals ---------------------------------------------------------------------------------

def test_signals_sent_before_the_wait_are_taken_one_per_wait_in_order():
    result = run_in_memory(approve, signals=[SentSignal("approve", "mine"),
                                             SentSignal("approve", {"ok": True}, sender_role="admin")])
    assert result == {"payload": {"ok": True}, "roles": ["member", "admin"]}
    # A dict sends one of each name, as the requester.
    assert run_in_memory(go, signals={"ready": 1, "go": {"at": 2}}) == {"at": 2}


def test_a_signal_sent_after_the_wait_puts_the_job_back_in_the_queue():
    job = MemoryJob(approve)
    assert job.run() == Outcome.WAITING and job.waits_for.signal == "approve"
    assert job.signal("approve", "a member's") == Status.QUEUED
    assert job.run() == Outcome.WAITING  # a member's approval is passed over
    assert job.signal("approve", "an owner's", sender_role="owner") == Status.QUEUED
    assert job.run() == Outcome.COMPLETED
    assert job.result == {"payload": "an owner's", "roles": ["member", "owner"]}
    taken = job.steps["signal:approve#2"]["_taken_signal"]
    assert (taken["sender_role"], taken["sent_by"]) == ("owner", str(job.requested_by))


def test_a_wait_for_a_signal_nobody_sent_is_not_completed_and_says_which():
    with pytest.raises(NotCompleted, match="waits for the signal 'approve'"):
        run_in_memory(approve, signals={"approve": "only a member's"})


def test_a_signal_wait_times_out_once_time_passes_its_timeout():
    job = MemoryJob(approve, {"timeout": 600})
    job.run()
    assert job.advance(599) == Status.WAITING
    assert job.advance(2) == Status.QUEUED
    assert job.run() == Outcome.FAILED
    assert isinstance(job.error, SignalTimeout) and job.error_code == "signal_timeout"
    with pytest.raises(SignalTimeout):
        job.run_until_done()  # ended failed: what it failed with


def test_a_cancelled_waiting_job_ends_cancelled():
    job = MemoryJob(approve)
    job.run()
    assert job.cancel() == Status.CANCELLED
    with pytest.raises(NotCompleted, match="cancelled"):
        job.run_until_done()


# -- failures and retries ----------------------------------------------------------------------

def test_a_transient_domain_error_is_retried_as_the_next_attempt():
    job = MemoryJob(flaky)
    assert job.run_until_done() == 2
    assert [(r.outcome, r.attempt) for r in job.runs] == [("retry", 1), ("completed", 2)]
    assert isinstance(job.runs[0].error, Flaky)


def test_a_bug_is_raised_unless_asked_to_record_it_as_a_worker_does():
    with pytest.raises(RuntimeError, match="a bug"):
        run_in_memory(flaky, {"bug": True})
    job = MemoryJob(flaky, {"bug": True}, raise_errors=False)
    assert job.run_until_done() == 2
    assert job.runs[0].outcome == "retry" and isinstance(job.runs[0].error, RuntimeError)


# -- children ----------------------------------------------------------------------------------

def test_a_fan_outs_children_run_in_memory_and_are_recorded():
    job = MemoryJob(fan, {"names": ["a", "b", "c"]})
    assert job.run_until_done() == ["A", "B", "C"]
    assert [(c.index, c.rules.name, c.params, c.status) for c in job.children] == [
        (0, "unit.memory.part", {"name": "a", "times": 1}, "completed"),
        (1, "unit.memory.part", {"name": "b", "times": 1}, "completed"),
        (2, "unit.memory.part", {"name": "c", "times": 1}, "completed")]
    assert job.progress[-1] == {"stage": "children", "done": 3, "total": 3}


def test_a_failed_child_fails_its_parent_as_the_engine_does():
    with pytest.raises(ChildrenFailed, match="1 of 2 parts did not complete: #2 failed"):
        run_in_memory(fan, {"names": ["a", "boom"]})


def test_a_workflows_steps_run_in_order_with_their_inputs():
    job = MemoryJob(flow)
    assert job.run_until_done() == {"steps": {"one": 1, "two": 11, "three": 111}, "result": 111}
    assert [c.inputs for c in job.children] == [[], [1], [11]]


def test_a_step_after_an_empty_group_runs_after_what_came_before_with_no_inputs():
    job = MemoryJob(flow_across_empty, {"first": "unit.memory.add"})
    assert job.run_until_done() == {"steps": {"one": 1, "after": 10}, "result": 10}
    assert [c.inputs for c in job.children] == [[], []]
    # What came before the empty group failed: the step after it is skipped, never made.
    refused = MemoryJob(flow_across_empty, {"first": "unit.memory.refuse"})
    with pytest.raises(StepsFailed, match="1 skipped"):
        refused.run_until_done()
    assert len(refused.children) == 1


@pytest.mark.parametrize(("policy", "made", "failure"), [
    ("run_all", 3, "1 of 4 steps did not complete, 1 skipped"),
    ("fail_fast", 2, "1 of 4 steps did not complete"),
])
def test_a_failed_step_skips_what_needs_it_and_under_fail_fast_everything_after_it(
        policy: str, made: int, failure: str):
    job = MemoryJob(flow_fails, {"policy": policy})
    with pytest.raises(StepsFailed, match=failure):
        job.run_until_done()
    assert len(job.children) == made  # the step after the refused one is never made


# -- what only the database has --------------------------------------------------------------

def test_the_tenant_needs_a_connection_given_or_says_so():
    with pytest.raises(testing.NeedsDatabase, match="conn="):
        run_in_memory(reads_the_tenant)

    class Fake:
        def fetch(self, organization: Any) -> str:
            return f"rows of {organization}"

    job = MemoryJob(reads_the_tenant, conn=Fake())
    assert job.run_until_done() == f"rows of {job.organization_id}"
