"""Workflows (models/jobs/canvas.py) on real workers: each step a job of its own, its
dependencies' results as its inputs, one submit for the whole, the failure policies, a cancel of
the whole, and a step that re-checks its requester and organization like any job."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from spacejobs.models.errors import OrganizationReadOnly, UnknownKind
from spacejobs.models.jobs.canvas import chain, chord, graph, group, sig
from tests.conftest import sign_in
from tests.kit.stack import Stack, wait_until

HTML = {"Accept": "text/html"}
PASSWORD = "a member's long password"


def steps_of(stack: Stack, job_id: object) -> dict[str, str]:
    with stack.admin() as conn:
        rows = conn.execute(text("SELECT (w.params -> 'steps' -> c.child_index ->> 'name') AS name,"
                                 " c.status FROM jobs c JOIN jobs w ON w.id = c.parent_id"
                                 " WHERE c.parent_id = :id"), {"id": job_id}).all()
    return {row.name: row.status for row in rows}


def start(stack: Stack, canvas, *, org=None, user=None, **options):
    org = org or stack.org()
    user = user or stack.user(org, role="owner")
    with stack.app_db.begin() as conn:
        job = stack.jobs.submit_workflow(conn, canvas, organization_id=org, requested_by=user.id,
                                         **options).job
    return org, user, job


def test_a_chain_hands_each_step_the_previous_result(stack: Stack):
    org, _, job = start(stack, chain(sig("test.add", n=1), sig("test.add", n=2),
                                     sig("test.add", n=3, name="last")))
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.job.status == "completed"
    assert outcome.result["result"] == 6 and outcome.result["steps"]["last"] == 6
    assert outcome.job.progress == {"stage": "steps", "done": 3, "total": 3}
    assert outcome.job.attempts == 1  # it waited between steps, holding no worker


def test_a_chord_gives_its_callback_the_groups_results_in_order(stack: Stack):
    org, _, job = start(stack, chord([sig("test.add", n=n) for n in (3, 1, 2)],
                                     sig("test.collect")))
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.result["result"] == [3, 1, 2]


def test_a_group_inside_a_chain_waits_for_every_member(stack: Stack):
    org, _, job = start(stack, chain(sig("test.add", n=1),
                                     group(sig("test.add", n=10), sig("test.add", n=20)),
                                     sig("test.collect")))
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.result["result"] == [11, 21]


def started_and_ended(stack: Stack, job_id: object) -> dict[str, tuple]:
    with stack.admin() as conn:
        rows = conn.execute(text("SELECT (w.params -> 'steps' -> c.child_index ->> 'name') AS name,"
                                 " c.started_at, c.finished_at FROM jobs c"
                                 " JOIN jobs w ON w.id = c.parent_id WHERE c.parent_id = :id"),
                            {"id": job_id}).all()
    return {row.name: (row.started_at, row.finished_at) for row in rows}


@pytest.mark.parametrize("empty", [group(), chord([], sig("test.collect", name="callback"))],
                         ids=["empty group", "chord with an empty header"])
def test_what_follows_an_empty_group_starts_only_after_what_came_before_it(stack: Stack, empty):
    canvas = chain(sig("test.add", n=1, name="x"), sig("bench.sleep", seconds=1.5, name="a"),
                   empty, sig("test.collect", name="b"))
    org, _, job = start(stack, canvas)
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.job.status == "completed"
    times = started_and_ended(stack, job.id)
    a_ended = times["a"][1]
    later = ["b", "callback"] if "callback" in times else ["b"]
    assert all(times[name][0] >= a_ended for name in later), times
    # The empty group's results, none, are what comes after it reads.
    if "callback" in times:
        assert outcome.result["steps"]["callback"] == [] and outcome.result["steps"]["b"] == [[]]
    else:
        assert outcome.result["steps"]["b"] == []


def test_fail_fast_cancels_what_is_left_and_fails_the_workflow(stack: Stack):
    org, _, job = start(stack, chord([sig("test.boom", name="boom"),
                                      sig("bench.sleep", seconds=60, name="slow")],
                                     sig("test.collect", name="callback")))
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert (outcome.job.status, outcome.job.error_code) == ("failed", "steps_failed")
    assert "step 1 test.boom failed (boom)" in outcome.job.error_message
    wait_for_steps = steps_of(stack, job.id)
    assert wait_for_steps["boom"] == "failed"
    assert wait_for_steps["slow"] in ("cancelled", "cancel_requested")
    assert "callback" not in wait_for_steps  # never started


def test_run_all_runs_what_can_run_and_lists_every_failed_and_skipped_step(stack: Stack):
    canvas = graph({"a": (sig("test.add", n=1), []), "b": (sig("test.boom"), []),
                    "c": (sig("test.add", n=2), ["a"]), "d": (sig("test.collect"), ["b"])})
    org, _, job = start(stack, canvas, policy="run_all")
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.job.error_code == "steps_failed"
    assert outcome.job.error_message == (
        "1 of 4 steps did not complete, 1 skipped: step 2 test.boom failed (boom);"
        " step 4 test.collect skipped")
    assert steps_of(stack, job.id) == {"a": "completed", "b": "failed", "c": "completed"}


def test_a_chord_whose_member_fails_under_run_all_runs_the_others_and_skips_the_callback(
        stack: Stack):
    org, _, job = start(stack, chord([sig("test.add", n=1, name="one"), sig("test.boom", name="boom"),
                                      sig("test.add", n=2, name="two")],
                                     sig("test.collect", name="callback")), policy="run_all")
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert (outcome.job.status, outcome.job.error_code) == ("failed", "steps_failed")
    assert outcome.job.error_message == (
        "1 of 4 steps did not complete, 1 skipped: step 2 test.boom failed (boom);"
        " step 4 test.collect skipped")
    assert steps_of(stack, job.id) == {"one": "completed", "boom": "failed", "two": "completed"}


def test_a_failed_workflow_names_its_steps_to_operators_by_place_never_by_their_names(
        stack: Stack, app, client):
    """Attack (operators see tenant text): members name their steps, and a step's name is part
    of the params operators never see; the failed workflow's error message, shown on /ops,
    carried the names ('customer ACME-4711 renewal failed'). It names each step by its place,
    kind, status and error code; the names stay on the members' page of the job."""
    org = stack.org()
    anna = stack.user(org, role="owner", password=PASSWORD)
    marker = f"customer ACME-{uuid.uuid4().hex}"
    _, _, job = start(stack, chain(sig("test.add", n=1, name=f"{marker} prepare"),
                                   sig("test.boom", name=f"{marker} renewal"),
                                   sig("test.collect", name=f"{marker} notify")),
                      org=org, user=anna, policy="run_all")
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert (outcome.job.status, outcome.job.error_code) == ("failed", "steps_failed")
    olga = stack.operator()
    seen = {"the workflow's error_message": stack.job_row(job.id)["error_message"],
            "/ops/api/jobs": client.get(f"/ops/api/jobs?organization_id={org}",
                                        headers=olga.auth).get_data(as_text=True),
            "/ops/api/jobs/<id>": client.get(f"/ops/api/jobs/{job.id}",
                                             headers=olga.auth).get_data(as_text=True),
            "/ops/jobs/<id>": client.get(f"/ops/jobs/{job.id}",
                                         headers=olga.auth | HTML).get_data(as_text=True)}
    print("step names found in:", [place for place, shown in seen.items() if marker in shown]
          or "nothing")
    assert [place for place, shown in seen.items() if marker in shown] == []
    assert outcome.job.error_message == (
        "1 of 3 steps did not complete, 1 skipped: step 2 test.boom failed (boom);"
        " step 3 test.collect skipped")
    browser = app.test_client()
    sign_in(browser, anna)
    assert f"{marker} renewal" in browser.get(f"/orgs/{org}/jobs/{job.id}").get_data(as_text=True)


def test_a_failed_step_is_retried_as_a_new_attempt_of_that_step_only(stack: Stack):
    org, _, job = start(stack, chain(sig("test.add", n=1, name="first"),
                                     sig("test.fails_once", name="flaky"),
                                     sig("test.add", n=1, name="last")))
    outcome = stack.jobs.wait(job.id, 60, organization_id=org)
    assert outcome.job.status == "completed"
    assert outcome.result["steps"]["flaky"] == {"attempt": 2, "inputs": [1]}
    with stack.admin() as conn:
        attempts = dict(conn.execute(text(
            "SELECT w.params -> 'steps' -> c.child_index ->> 'name', c.attempts FROM jobs c"
            " JOIN jobs w ON w.id = c.parent_id WHERE c.parent_id = :id"), {"id": job.id}).all())
        leases = dict(conn.execute(text(
            "SELECT w.params -> 'steps' -> c.child_index ->> 'name', count(*) FROM jobs c"
            " JOIN jobs w ON w.id = c.parent_id JOIN job_history e ON e.job_id = c.id"
            " WHERE c.parent_id = :id AND e.to_status = 'leased' GROUP BY 1"), {"id": job.id}).all())
    # One job per step: the flaky one ran twice, the others once; the workflow's own attempt
    # was not used up by its step's failure.
    assert attempts == {"first": 1, "flaky": 2, "last": 1}
    assert leases == {"first": 1, "flaky": 2, "last": 1}
    assert outcome.job.attempts == 1


def test_cancelling_the_workflow_cancels_its_steps(stack: Stack, client):
    org, user, job = start(stack, chain(sig("bench.sleep", seconds=30, name="long"),
                                        sig("test.add", name="after")))
    stack.wait_for(job.id, "waiting", timeout=30)
    answer = client.post(f"/api/v1/orgs/{org}/jobs/{job.id}/cancel", headers=user.auth)
    assert answer.status_code == 200
    outcome = stack.jobs.wait(job.id, 30, organization_id=org)
    assert outcome.job.status == "cancelled"
    # The running step stops at its next checkpoint; the one after it never starts.
    wait_until(lambda: steps_of(stack, job.id) == {"long": "cancelled"}, 30,
               lambda: f"the steps cancelled ({steps_of(stack, job.id)})")


def test_cancelling_the_workflow_stops_the_whole_tree_below_it(stack: Stack, client):
    # The workflow's step is a fan-out whose children are the workflow's grandchildren: one
    # runs, the other waits for room.
    parts = [{"n": 1, "seconds": 30}, {"n": 2, "seconds": 30}, {"n": 3, "seconds": 30}]
    org, user, job = start(stack, chain(sig("test.fan", parts=parts, max_parallel=1,
                                            name="fan"), sig("test.add", name="after")))

    def grandchildren() -> dict[int, str]:
        with stack.admin() as conn:
            rows = conn.execute(text("SELECT g.child_index, g.status FROM jobs c"
                                     " JOIN jobs g ON g.parent_id = c.id WHERE c.parent_id = :id"),
                                {"id": job.id}).all()
        return {row.child_index: row.status for row in rows}

    wait_until(lambda: grandchildren() == {0: "leased"}, 30, "the first grandchild running")
    answer = client.post(f"/api/v1/orgs/{org}/jobs/{job.id}/cancel", headers=user.auth)
    assert answer.status_code == 200
    assert stack.jobs.wait(job.id, 30, organization_id=org).job.status == "cancelled"
    # The step (waiting for its children) ended with it; the running grandchild stops at its
    # next checkpoint; the others were never made; nothing runs on.
    wait_until(lambda: grandchildren() == {0: "cancelled"}, 30,
               lambda: f"the grandchild cancelled ({grandchildren()})")
    assert steps_of(stack, job.id) == {"fan": "cancelled"}
    moves = [(e["from_status"], e["to_status"]) for e in stack.events(
        next(iter(_grandchild_ids(stack, job.id))))]
    assert moves[-2:] == [("leased", "cancel_requested"), ("cancel_requested", "cancelled")]


def _grandchild_ids(stack: Stack, job_id: object) -> list[str]:
    with stack.admin() as conn:
        return [str(i) for (i,) in conn.execute(text(
            "SELECT g.id FROM jobs c JOIN jobs g ON g.parent_id = c.id WHERE c.parent_id = :id"),
            {"id": job_id})]


def test_a_step_re_checks_its_requester_like_any_job(stack: Stack):
    org = stack.org()
    vera = stack.user(org, role="member")
    _, _, job = start(stack, chain(sig("test.add", n=1), sig("bench.sleep", seconds=2),
                                   sig("test.add", n=1, name="after removal")), org=org, user=vera)
    stack.wait_for(job.id, "waiting", timeout=30)
    stack.remove_member(org, vera.id)
    done = stack.wait_for(job.id, "failed", timeout=60)
    assert done["error_code"] == "steps_failed"
    assert "requester_not_member" in done["error_message"]


def test_in_a_read_only_organization_a_workflow_starts_only_if_each_of_its_steps_may(
        stack: Stack):
    org = stack.org()
    anna = stack.user(org, role="owner")
    stack.set_state(org, "read_only")
    _, _, allowed = start(stack, chain(sig("bench.noop"), sig("test.collect")), org=org, user=anna)
    assert stack.jobs.wait(allowed.id, 60, organization_id=org).job.status == "completed"
    # A step that may not start here refuses the whole workflow at its submit, naming the step.
    with pytest.raises(OrganizationReadOnly) as refused, stack.app_db.begin() as conn:
        stack.jobs.submit_workflow(conn, chain(sig("bench.noop"), sig("test.add", n=1)),
                                   organization_id=org, requested_by=anna.id)
    assert refused.value.details["step"] == 1
    assert stack.count_jobs(org) == 3  # the first workflow and its two steps, nothing more


@pytest.mark.parametrize("bad", [sig("no.such.kind"),
                                 sig("projects_report.project", project_id=str(uuid.uuid4()))])
def test_a_step_a_submit_would_refuse_refuses_the_whole_workflow_and_writes_nothing(stack: Stack, bad):
    org = stack.org()
    anna = stack.user(org, role="owner")
    with pytest.raises(UnknownKind) as refused, stack.app_db.begin() as conn:
        stack.jobs.submit_workflow(conn, chain(sig("bench.noop"), bad), organization_id=org,
                                   requested_by=anna.id)
    assert refused.value.details["step"] == 1
    assert stack.count_jobs(org) == 0


def test_a_workflow_posted_to_the_jobs_endpoint_is_checked_the_same_way(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    body = {"kind": "workflow", "params": {"steps": [
        {"name": "a", "kind": "bench.noop"}, {"name": "b", "kind": "projects_report.project",
                                              "params": {"project_id": str(uuid.uuid4())}, "after": [0]}]}}
    answer = client.post(f"/api/v1/orgs/{org}/jobs", json=body, headers=anna.auth)
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "unknown_kind"
    assert stack.count_jobs(org) == 0
