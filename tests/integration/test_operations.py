"""Operators: who may see /ops and /metrics, what they see (never tenant data), what they can do."""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.tenancy import passwords
from tests.conftest import csrf_of, sign_in, submit
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack, wait_until

MARKER = "ZEBRA-MARKER-41d9"
PASSWORD = "operator's long password"

OPS_GET_URLS = ["/ops", "/ops/jobs", "/ops/workers", "/ops/api/overview", "/ops/api/jobs",
                "/ops/api/workers", "/ops/api/audit", "/metrics"]


@pytest.fixture(scope="module")
def operator(stack: Stack):
    return stack.operator()


def test_everyone_but_operators_gets_the_404_of_an_unknown_url(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    job = submit(client, org, owner, "bench.noop")
    missing = client.get("/no/such/page").get_data()
    urls = [*OPS_GET_URLS, f"/ops/jobs/{job['id']}", f"/ops/api/jobs/{job['id']}"]
    for headers in ({}, owner.auth, {"Authorization": "Bearer sj_not-a-token"}):
        for url in urls:
            answer = client.get(url, headers=headers)
            assert (answer.status_code, answer.get_data()) == (404, missing), (url, headers)
        for url in (f"/ops/api/jobs/{job['id']}/cancel", "/ops/api/kinds/bench.noop/pause"):
            assert client.post(url, headers=headers).status_code == 404


def test_no_ops_page_shows_params_or_results(stack: Stack, client, operator):
    org = stack.org()
    anna = stack.user(org, role="owner")
    client.post(f"/api/v1/orgs/{org}/projects", json={"name": MARKER}, headers=anna.auth)
    export = submit(client, org, anna, "projects_export")
    imported = submit(client, org, anna, "projects_import", {"projects": [{"name": MARKER + "-in"}]})
    for job in (export, imported):
        stack.wait_for(job["id"], "completed")
    assert MARKER in client.get(export["links"]["result"], headers=anna.auth).get_data(as_text=True)

    for url in [*OPS_GET_URLS, f"/ops/jobs?organization_id={org}",
                *(f"/ops/jobs/{j['id']}" for j in (export, imported)),
                *(f"/ops/api/jobs/{j['id']}" for j in (export, imported))]:
        answer = client.get(url, headers=operator.auth)
        assert answer.status_code == 200, url
        assert MARKER not in answer.get_data(as_text=True), url


def test_operator_role_cannot_read_params_or_results_even_directly(stack: Stack):
    with pytest.raises(Exception, match="permission denied"), transaction(stack.operator_db) as conn:
        conn.execute(text("SELECT params FROM jobs LIMIT 1"))
    with pytest.raises(Exception, match="permission denied"), transaction(stack.operator_db) as conn:
        conn.execute(text("SELECT result FROM jobs LIMIT 1"))


def test_pause_stops_claims_on_every_worker_and_resume_restarts_them(stack: Stack, client, operator):
    org = stack.org()
    anna = stack.user(org, role="owner")
    assert client.post("/ops/api/kinds/bench.noop/pause", headers=operator.auth).status_code == 200
    # The stack's workers keep no controls between claims (SPACEJOBS_CONTROLS_TTL=0), so the
    # next claim anywhere sees the pause.
    try:
        jobs = [submit(client, org, anna, "bench.noop") for _ in range(4)]
        other = submit(client, org, anna, "projects_export")  # other kinds still run
        stack.wait_for(other["id"], "completed")
        # Re-signalled twice by the sweeper: a job is re-signalled only while still queued a
        # grace after its last wake-up, so the second proves the first woke nobody who claimed.
        signals: dict[str, set] = {j["id"]: set() for j in jobs}

        def resignalled_twice() -> bool:
            for job_id, seen in signals.items():
                row = stack.job_row(job_id)
                assert row["status"] == "queued", row["status"]
                if row["last_wakeup_at"] > row["created_at"]:  # the submit's own is not one
                    seen.add(row["last_wakeup_at"])
            return all(len(seen) >= 2 for seen in signals.values())

        wait_until(resignalled_twice, timeout=30, what="every paused job re-signalled twice")
    finally:
        assert client.post("/ops/api/kinds/bench.noop/resume", headers=operator.auth).status_code == 200
    for job in jobs:
        stack.wait_for(job["id"], "completed", timeout=20)
    audit = client.get("/ops/api/audit", headers=operator.auth).get_json()["audit"]
    assert [(a["action"], a["target"], a["detail"]) for a in audit[:2]] == [
        ("kind_control", "bench.noop", {"paused": False}),
        ("kind_control", "bench.noop", {"paused": True})]
    assert audit[0]["operator"] == operator.email


def test_global_concurrency_limit_holds_across_worker_processes(bare_stack: Stack):
    stack = bare_stack
    operator = stack.operator()
    org = stack.org()
    anna = stack.user(org, role="owner")
    client = stack.make_app().test_client()
    # The limit first: a worker process reads the controls at its first claim, so no process
    # can act on controls older than the limit.
    assert client.post("/ops/api/kinds/bench.sleep/limit", json={"limit": 2},
                       headers=operator.auth).status_code == 200
    for _ in range(3):
        stack.start_worker(concurrency=2)  # six processes that could run jobs at once
    jobs = [submit(client, org, anna, "bench.sleep", {"seconds": 0.4}) for _ in range(14)]
    peak, samples, done = 0, 0, False

    def sample() -> None:
        nonlocal peak, samples
        while not done:
            with transaction(stack.operator_db) as conn:
                running = conn.execute(text(
                    "SELECT count(*) FROM jobs WHERE kind = 'bench.sleep'"
                    " AND status IN ('leased', 'cancel_requested')")).scalar()
            peak, samples = max(peak, running), samples + 1
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        for job in jobs:
            stack.wait_for(job["id"], "completed", timeout=60)
    finally:
        done = True
        sampler.join()
    assert peak == 2, (peak, samples)
    assert samples > 50


def test_metrics_parse_and_move_as_jobs_run(stack: Stack, client, operator):
    def scrape() -> dict[tuple[str, tuple], float]:
        answer = client.get("/metrics", headers=operator.auth)
        assert answer.status_code == 200 and answer.mimetype == "text/plain"
        values = {}
        for family in text_string_to_metric_families(answer.get_data(as_text=True)):
            for sample in family.samples:
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return values

    org = stack.org()
    anna = stack.user(org, role="owner")
    before = scrape()
    finished = ("spacejobs_jobs_finished_total", (("kind", "projects_export"), ("outcome", "completed")))
    waits = ("spacejobs_job_queue_wait_seconds_count", (("kind", "projects_export"),))
    job = submit(client, org, anna, "projects_export")
    stack.wait_for(job["id"], "completed")
    after = scrape()
    assert after[finished] == before.get(finished, 0) + 1
    assert after[waits] == before.get(waits, 0) + 1
    assert after[("spacejobs_workers_online", ())] >= 1
    # The web's wake-up counter is flushed in the background (every 5 s), so it is not asserted here.
    # Labels are low-cardinality only: no organization or job ids anywhere.
    body = client.get("/metrics", headers=operator.auth).get_data(as_text=True)
    assert str(org) not in body and job["id"] not in body
    assert not re.search(r"organization|job_id", body)


def test_histogram_buckets_are_the_same_in_sql_and_in_metrics(stack: Stack):
    from spacejobs.models.ops.metrics import BUCKETS

    with transaction(stack.operator_db) as conn:
        assert tuple(conn.execute(text("SELECT metric_buckets()")).scalar_one()) == BUCKETS
        # metric_bucket() is a CASE (inlined into the batch triggers): each bound, and just past
        # it, lands where the bound list says.
        probes = [float(v) for bound in BUCKETS for v in (bound, bound * 1.0001)] + [0.0, 1e9]
        labels = conn.execute(text("SELECT metric_bucket(v) FROM unnest(CAST(:v AS float8[])) v"),
                              {"v": probes}).scalars().all()
    expected = [next((str(b) if b != int(b) else str(int(b)) for b in BUCKETS if v <= b), "+Inf")
                for v in probes]
    assert labels == expected


def test_a_sigkilled_worker_shows_offline_after_the_silence(bare_stack: Stack):
    stack = bare_stack
    operator = stack.operator()
    client = stack.make_app(WORKER_OFFLINE_AFTER=2).test_client()
    worker = stack.start_worker(concurrency=1, SPACEJOBS_PRESENCE_INTERVAL="0.5")

    def states() -> dict[int, bool]:
        rows = client.get("/ops/api/workers", headers=operator.auth).get_json()["workers"]
        return {w["pid"]: w["online"] for w in rows}

    wait_until(lambda: any(states().values()), timeout=15, what="the worker shown online")
    online_pids = [pid for pid, online in states().items() if online]
    worker.signal_group(signal.SIGKILL)
    # Offline comes from the silence alone (2 s here); poll rather than sleep a fixed time, so a
    # loaded machine that delays this test's own requests cannot make it flaky.
    wait_until(lambda: all(states()[pid] is False for pid in online_pids),
               what="the killed worker shown offline")


def test_operator_cancel_and_retry_as_new_job_are_audited(stack: Stack, client, operator):
    org = stack.org()
    anna = stack.user(org, role="owner")
    failing = submit(client, org, anna, "test.fail")
    stack.wait_for(failing["id"], "failed", timeout=30)
    retried = client.post(f"/ops/api/jobs/{failing['id']}/retry", headers=operator.auth).get_json()
    assert retried["id"] != failing["id"] and retried["retry_of"] == failing["id"]
    assert stack.job_row(failing["id"])["status"] == "failed"  # terminal states never come back
    new_row = stack.job_row(retried["id"])
    assert (new_row["retry_of"], new_row["requested_by"], new_row["kind"]) == (
        uuid.UUID(failing["id"]), anna.id, "test.fail")

    running = submit(client, org, anna, "bench.sleep", {"seconds": 20})
    stack.wait_for(running["id"], "leased")
    answer = client.post(f"/ops/api/jobs/{running['id']}/cancel", headers=operator.auth)
    assert answer.get_json()["status"] == "cancel_requested"
    # A job asked to stop is still running until it reaches a checkpoint: the dashboard says so.
    overview = client.get("/ops/api/overview", headers=operator.auth).get_json()
    shown = {j["id"]: j["status"] for j in overview["running"]}
    assert shown.get(running["id"]) == "cancel_requested" or \
        stack.job_row(running["id"])["status"] == "cancelled"
    stack.wait_for(running["id"], "cancelled", timeout=15)
    assert stack.events(running["id"])[2]["actor"] == f"operator:{operator.id}"

    completed = submit(client, org, anna, "bench.noop")
    stack.wait_for(completed["id"], "completed")
    refused = client.post(f"/ops/api/jobs/{completed['id']}/retry", headers=operator.auth)
    assert refused.status_code == 400

    audit = client.get("/ops/api/audit", headers=operator.auth).get_json()["audit"]
    actions = {(a["action"], a["target"]) for a in audit}
    assert {("retry", failing["id"]), ("cancel", running["id"])} <= actions


def test_dashboard_sign_in_needs_an_operator_and_forms_need_csrf(stack: Stack, client, operator):
    org = stack.org()
    owner = stack.user(org, role="owner", password=PASSWORD)
    with stack.make_app().test_client() as browser:
        sign_in(browser, owner)
        assert browser.get("/ops").status_code == 404
    browser = stack.make_app().test_client()
    # An API token no longer opens a session: /login takes an email and a password.
    assert browser.post("/login", data={"token": operator.token,
                                        "csrf": csrf_of(browser.get("/login"))}).status_code == 401
    with stack.admin() as conn:
        passwords.set_password(conn, operator.id, PASSWORD)
    sign_in(browser, TestUser(operator.id, operator.email, operator.token, PASSWORD))
    page = browser.get("/ops")
    assert page.status_code == 200 and b"Overview" in page.data
    assert browser.post("/ops/api/kinds/bench.noop/pause", data={"x": "1"}).status_code == 400
    csrf = csrf_of(page)
    assert browser.post("/ops/api/kinds/bench.noop/pause", data={"csrf": csrf}).status_code == 302
    assert browser.post("/ops/api/kinds/bench.noop/resume", data={"csrf": csrf}).status_code == 302
    # The session never opens the tenant API: only a bearer token does.
    assert browser.get("/api/v1/me").status_code == 401


def test_one_exports_request_id_is_in_the_web_line_and_every_worker_line(stack: Stack, client, caplog):
    org = stack.org()
    anna = stack.user(org, role="owner")
    request_id = "trace-" + uuid.uuid4().hex[:12]
    with caplog.at_level("INFO", logger="spacejobs.jobs"):
        answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "projects_export"},
                             headers={**anna.auth, "X-Request-ID": request_id})
    assert answer.headers["X-Request-ID"] == request_id
    job_id = answer.get_json()["id"]
    web_lines = [r for r in caplog.records if getattr(r, "request_id", None) == request_id]
    assert web_lines and web_lines[0].job_id == job_id
    stack.wait_for(job_id, "completed")

    def worker_lines() -> list[str]:
        return [line for p in stack.processes for line in p.output().splitlines()
                if f"job_id={job_id}" in line]

    # The attempt's last line, written once its finish is committed.
    wait_until(lambda: any("job attempt ended" in line for line in worker_lines()),
               what="the worker's line for the end of the attempt")
    worker_lines = worker_lines()
    for line in worker_lines:
        assert f"request_id={request_id}" in line and "kind=projects_export" in line
        assert f"organization_id={org}" in line and "attempt=1" in line


def test_waiting_jobs_are_counted_by_kind_and_by_what_they_wait_for_never_by_signal_name(
        stack: Stack, client, operator):
    from spacejobs.models.ops.dashboard import waiting

    def scrape() -> dict[tuple[str, tuple], float]:
        body = client.get("/metrics", headers=operator.auth).get_data(as_text=True)
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body) for s in family.samples}

    def by_kind() -> dict[str, dict]:
        with transaction(stack.operator_db) as conn:
            return {k["kind"]: k for k in waiting(conn)["kinds"]}

    signal_name = "zebra-marker-41d9-approval"  # the kind author's word: shown to no operator
    org = stack.org()
    anna = stack.user(org, role="owner")
    before = client.get("/ops/api/overview", headers=operator.auth).get_json()["waiting"]
    long_timer = submit(client, org, anna, "bench.wait", {"seconds": 3600})
    short_timer = submit(client, org, anna, "bench.wait", {"seconds": 1.5})
    signal = submit(client, org, anna, "bench.await_signal", {"name": signal_name, "timeout": 3600})
    fan = submit(client, org, anna, "test.fan", {"parts": [{"n": 1, "seconds": 30}]})
    jobs = (long_timer, short_timer, signal, fan)
    for job in jobs:
        stack.wait_for(job["id"], "waiting")
    with stack.workers_paused():  # and beat: the short timer falls due and stays so
        wait_until(lambda: by_kind()["bench.wait"]["due"] == 1, what="the short timer due")
        kinds = by_kind()
        assert {k: (v["waiting"], v["timer"], v["signal"], v["children"], v["due"])
                for k, v in kinds.items()} == {
            "bench.wait": (2, 2, 0, 0, 1), "bench.await_signal": (1, 0, 1, 0, 0),
            "test.fan": (1, 0, 0, 1, 0)}
        # Since when the oldest waits: the moment its row went waiting.
        assert kinds["bench.wait"]["oldest_since"] == min(
            stack.job_row(j["id"])["updated_at"] for j in (long_timer, short_timer))
        overview = client.get("/ops/api/overview", headers=operator.auth).get_json()["waiting"]
        assert (overview["waiting"], overview["timer"], overview["signal"], overview["children"],
                overview["due"]) == (before["waiting"] + 4, before["timer"] + 2,
                                     before["signal"] + 1, before["children"] + 1, before["due"] + 1)
        assert overview["oldest_seconds"] >= kinds["bench.wait"]["oldest_seconds"] > 0
        page = client.get("/ops", headers=operator.auth).get_data(as_text=True)
        assert f"Waiting ({overview['waiting']})" in page
        assert "due but not resumed yet: is a sweeper (beat) running?" in page
        detail = client.get(f"/ops/jobs/{signal['id']}", headers=operator.auth).get_data(as_text=True)
        assert "a signal, until" in detail
        for url in ("/ops", "/ops/api/overview", "/ops/jobs?status=waiting", "/metrics",
                    *(f"/ops/jobs/{j['id']}" for j in jobs),
                    *(f"/ops/api/jobs/{j['id']}" for j in jobs)):
            assert signal_name not in client.get(url, headers=operator.auth).get_data(as_text=True), url

        metrics = scrape()
        gauge = "spacejobs_jobs"
        assert metrics[(gauge, (("kind", "bench.wait"), ("status", "waiting")))] == 2
        assert metrics[(gauge, (("kind", "bench.await_signal"), ("status", "waiting")))] == 1
        assert metrics[(gauge, (("kind", "test.fan"), ("status", "waiting")))] == 1
        assert metrics[("spacejobs_oldest_due_wait_seconds", (("kind", "bench.wait"),))] > 0
        assert ("spacejobs_oldest_due_wait_seconds", (("kind", "bench.await_signal"),)) not in metrics
    # Beat, thawed, resumes the due timer. (Cancels wait for the thaw: a frozen worker may hold
    # the lock of the fan-out's part, which a cancel of its parent updates too.)
    stack.wait_for(short_timer["id"], "completed")
    # An operator cancels a waiting job at once, as a queued one: no worker to tell.
    for job in (long_timer, signal, fan):
        answer = client.post(f"/ops/api/jobs/{job['id']}/cancel", headers=operator.auth)
        assert answer.get_json()["status"] == "cancelled"
    assert not {"bench.wait", "bench.await_signal", "test.fan"} & set(by_kind())
    metrics = scrape()
    assert ("spacejobs_jobs", (("kind", "bench.wait"), ("status", "waiting"))) not in metrics
    assert ("spacejobs_oldest_due_wait_seconds", (("kind", "bench.wait"),)) not in metrics
