"""The operators' dashboard scans in seconds: kinds in a compact table sorted by activity (idle
and child-only kinds folded away), names beside ids, organization pickers, a workflow's steps
grouped, slots busy and free, offline workers reconciled and aged out, ISO 8601 in the JSON."""

from __future__ import annotations

import re
import signal
from datetime import datetime

import pytest
from sqlalchemy import text

from tests.conftest import submit
from tests.kit.stack import Stack, wait_until

ISO_8601 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$")
RFC_1123 = re.compile(r"^[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} ")


@pytest.fixture(scope="module")
def operator(bare_stack: Stack):
    return bare_stack.operator()


def dates_in(value: object, found: list[str]) -> list[str]:
    """Every string of a JSON document that looks like a date, either way."""
    if isinstance(value, dict):
        for item in value.values():
            dates_in(item, found)
    elif isinstance(value, list):
        for item in value:
            dates_in(item, found)
    elif isinstance(value, str) and (RFC_1123.match(value) or re.match(r"^\d{4}-\d\d-\d\dT", value)):
        found.append(value)
    return found


def test_every_slot_busy_is_said_and_the_json_dates_are_iso_8601(bare_stack: Stack, operator):
    stack = bare_stack
    org = stack.org("Busy Rockets")
    anna = stack.user(org, role="owner")
    app = stack.make_app(WORKER_OFFLINE_AFTER=5)
    client = app.test_client()
    worker = stack.start_worker(concurrency=2, SPACEJOBS_PRESENCE_INTERVAL="0.3")
    try:
        long_jobs = [submit(client, org, anna, "bench.sleep", {"seconds": 30}) for _ in range(2)]
        waiting = submit(client, org, anna, "bench.sleep", {"seconds": 30})
        for job in long_jobs:
            stack.wait_for(job["id"], "leased")

        def overview() -> dict:
            return client.get("/ops/api/overview", headers=operator.auth).get_json()

        wait_until(lambda: overview()["slots"] == {"total": 2, "busy": 2, "free": 0},
                   timeout=20, what="both slots shown busy")
        assert stack.job_row(waiting["id"])["status"] == "queued"
        page = client.get("/ops", headers=operator.auth).get_data(as_text=True)
        assert "Every slot is busy" in page
        assert "2 of 2 running; 1 queued job waits for a slot" in page

        # Every date of every operators' JSON answer is ISO 8601, as in the tenant API.
        found: list[str] = []
        for url in ("/ops/api/overview", "/ops/api/workers", "/ops/api/jobs",
                    f"/ops/api/jobs/{long_jobs[0]['id']}", "/ops/api/audit"):
            dates_in(client.get(url, headers=operator.auth).get_json(), found)
        assert len(found) > 10
        assert [d for d in found if not ISO_8601.match(d)] == []
        for value in found:
            datetime.fromisoformat(value)  # and each one parses back
        tenant = client.get(f"/api/v1/orgs/{org}/jobs/{waiting['id']}", headers=anna.auth).get_json()
        assert ISO_8601.match(tenant["created_at"])
    finally:
        stack.retire(worker)


def test_offline_workers_run_nothing_and_age_out(bare_stack: Stack, operator):
    stack = bare_stack
    client = stack.make_app(WORKER_OFFLINE_AFTER=2).test_client()
    killed = stack.start_worker(concurrency=1, SPACEJOBS_PRESENCE_INTERVAL="0.3")
    stopped = stack.start_worker(concurrency=1, SPACEJOBS_PRESENCE_INTERVAL="0.3")

    def rows() -> dict[int, dict]:
        answer = client.get("/ops/api/workers", headers=operator.auth).get_json()
        return {w["pid"]: w for w in answer["workers"]}

    def pool_pids(process) -> set[int]:
        import psutil
        return {child.pid for child in psutil.Process(process.pid).children()}

    wait_until(lambda: pool_pids(killed) <= set(rows()) and pool_pids(stopped) <= set(rows()),
               timeout=20, what="both workers' processes listed")
    killed_pids, stopped_pids = pool_pids(killed), pool_pids(stopped)
    # The killed process's last heartbeat said it ran a job: it never says otherwise again.
    with stack.admin() as conn:
        conn.execute(text("UPDATE worker_processes SET running = 1 WHERE pid = ANY(:pids)"),
                     {"pids": list(killed_pids)})
    killed.signal_group(signal.SIGKILL)
    stopped.popen.send_signal(signal.SIGTERM)
    assert stopped.popen.wait(timeout=30) == 0
    wait_until(lambda: all(not rows()[pid]["online"] for pid in killed_pids | stopped_pids),
               timeout=20, what="both shown offline or stopped")
    shown = rows()
    for pid in killed_pids | stopped_pids:
        assert (shown[pid]["running"], shown[pid]["slots"]) == (0, 0), shown[pid]
    assert all(shown[pid]["stopped_at"] for pid in stopped_pids)
    assert client.get("/ops/api/overview", headers=operator.auth).get_json()["slots"]["busy"] == 0

    # Five minutes after a stop, an hour after the last heartbeat: no longer listed.
    with stack.admin() as conn:
        conn.execute(text("UPDATE worker_processes SET stopped_at = now() - interval '6 minutes', "
                          "last_seen_at = now() - interval '6 minutes' WHERE pid = ANY(:pids)"),
                     {"pids": list(stopped_pids)})
        conn.execute(text("UPDATE worker_processes SET last_seen_at = now() - interval '61 minutes' "
                          "WHERE pid = ANY(:pids)"), {"pids": list(killed_pids)})
    assert not (killed_pids | stopped_pids) & set(rows())
    stack.retire(killed, stopped)


def test_kinds_are_one_row_each_by_activity_with_idle_and_child_only_kinds_folded(
        bare_stack: Stack, operator):
    stack = bare_stack
    org = stack.org("Table Rockets")
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    # No worker: jobs stay queued, so the activity is what this test made.
    for _ in range(3):
        submit(client, org, anna, "bench.noop")
    submit(client, org, anna, "bench.sleep", {"seconds": 1})
    page = client.get("/ops", headers=operator.auth).get_data(as_text=True)
    active, _, folded = page.partition('id="child-only-kinds"')
    kinds_table = active[active.index('id="kinds"'):]
    rows = re.findall(r'<tr data-kind="([^"]+)" data-activity="(\d+)"', kinds_table)
    assert "bench.noop" in dict(rows)
    activity = [int(count) for _, count in rows]
    assert activity == sorted(activity, reverse=True) and activity[-1] > 0
    child_only, _, idle = folded.partition('id="idle-kinds"')
    assert 'data-kind="projects_report.project"' in child_only  # a child-only kind
    assert 'data-kind="projects_export"' in idle  # registered, nothing in the last hour
    assert 'data-kind="projects_export"' not in kinds_table
    # Sorted by another column on demand (A to Z here).
    by_name = client.get("/ops?sort=kind", headers=operator.auth).get_data(as_text=True)
    names = re.findall(r'<tr data-kind="([^"]+)"', by_name[by_name.index('id="kinds"'):
                                                           by_name.index('id="child-only-kinds"')])
    assert names == sorted(names) and "bench.noop" in names
    # The chart says what it plots: title, units, axis, legend.
    for words in ("Finished per minute, last hour", "jobs/min", "\u221260 min", "now", "completed", "failed"):
        assert words in page
    # The rate-limit form picks an organization by name; no UUID to paste.
    form = page[page.index('action="/ops/api/rate-limits"', page.index("<h2 id=\"rate-limits\"")):]
    assert f'<option value="{org}">Table Rockets' in form


def test_names_beside_ids_and_a_workflows_steps_under_it(bare_stack: Stack, operator):
    stack = bare_stack
    org = stack.org("Names Rockets")
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    for name in ("Apollo", "Gemini"):
        assert client.post(f"/api/v1/orgs/{org}/projects", json={"name": name},
                           headers=anna.auth).status_code == 201
    report = submit(client, org, anna, "projects_report", {})
    worker = stack.start_worker(concurrency=2)
    try:
        stack.wait_for(report["id"], "completed", "failed", timeout=60)
    finally:
        stack.retire(worker)
    api = client.get(f"/ops/api/jobs?organization_id={org}", headers=operator.auth).get_json()["jobs"]
    assert {(j["organization"], j["requester"]) for j in api} == {("Names Rockets", anna.email)}
    page = client.get(f"/ops/jobs?organization_id={org}", headers=operator.auth).get_data(as_text=True)
    assert "Names Rockets" in page and anna.email in page
    steps = [j for j in api if j["parent_id"] == report["id"]]
    assert len(steps) >= 3  # a part per project, and the merge
    rows = re.findall(r'<tr class="(top|step)" data-job="([^"]+)"', page)
    # The workflow first (newest), its steps right under it, in their order; nothing else.
    assert rows[0] == ("top", report["id"])
    assert sorted(rows[1:]) == sorted(("step", s["id"]) for s in steps)
    assert f"{len(steps)} steps: {len(steps)} completed" in page
