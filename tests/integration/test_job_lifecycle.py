"""The whole path through HTTP and a real worker process: submit → leased → completed → result."""

from __future__ import annotations

import json

from tests.kit.stack import Stack, wait_until


def test_export_goes_queued_leased_completed_and_returns_only_its_orgs_projects(stack: Stack, client):
    org, other = stack.org(), stack.org()
    anna = stack.user(org, role="owner")
    outsider = stack.user(other, role="owner")
    for name in ("alpha", "beta"):
        assert client.post(f"/api/v1/orgs/{org}/projects", json={"name": name},
                           headers=anna.auth).status_code == 201
    client.post(f"/api/v1/orgs/{other}/projects", json={"name": "not-yours"}, headers=outsider.auth)

    answer = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "projects_export"},
                         headers=anna.auth)
    assert answer.status_code == 202
    job = answer.get_json()
    assert answer.headers["Location"] == f"/api/v1/orgs/{org}/jobs/{job['id']}"
    assert job["status"] == "queued"
    assert job["organization_id"] == str(org) and job["requested_by"] == str(anna.id)

    seen = {job["status"]}

    def completed() -> dict | None:
        polled = client.get(answer.headers["Location"], headers=anna.auth).get_json()
        seen.add(polled["status"])
        return polled if polled["status"] == "completed" else None

    job = wait_until(completed, interval=0.01, what=lambda: f"the job completed (seen {seen})")
    assert job["attempts"] == 1 and job["started_at"] and job["finished_at"]
    assert job["progress"] == {"stage": "writing the file", "done": 2, "total": 2}

    result = client.get(job["links"]["result"], headers=anna.auth)
    assert result.status_code == 200
    names = sorted(p["name"] for p in result.get_json()["result"]["projects"])
    assert names == ["alpha", "beta"]

    transitions = [(e["from_status"], e["to_status"]) for e in stack.events(job["id"])]
    assert transitions == [(None, "queued"), ("queued", "leased"), ("leased", "completed")]


def test_list_is_newest_first_with_filters_and_cursor(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    ids = []
    for _ in range(5):
        ids.append(client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"},
                               headers=anna.auth).get_json()["id"])
    for job_id in ids:
        stack.wait_for(job_id, "completed")

    page = client.get(f"/api/v1/orgs/{org}/jobs?limit=2", headers=anna.auth).get_json()
    assert [j["id"] for j in page["jobs"]] == ids[::-1][:2]
    rest = client.get(f"/api/v1/orgs/{org}/jobs?limit=10&cursor={page['next_cursor']}",
                      headers=anna.auth).get_json()
    assert [j["id"] for j in rest["jobs"]] == ids[::-1][2:]
    assert rest["next_cursor"] is None

    assert client.get(f"/api/v1/orgs/{org}/jobs?status=queued", headers=anna.auth).get_json()["jobs"] == []
    assert len(client.get(f"/api/v1/orgs/{org}/jobs?kind=bench.noop&status=completed",
                          headers=anna.auth).get_json()["jobs"]) == 5
    bad = client.get(f"/api/v1/orgs/{org}/jobs?cursor=%%%", headers=anna.auth)
    assert bad.status_code == 400 and bad.get_json()["error"]["code"] == "invalid_request"


def test_result_before_completion_is_409_job_not_completed(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.sleep", "params": {"seconds": 1}},
                      headers=anna.auth).get_json()
    answer = client.get(job["links"]["result"], headers=anna.auth)
    assert answer.status_code == 409
    assert answer.get_json()["error"]["code"] == "job_not_completed"
    stack.wait_for(job["id"], "completed")
    assert client.get(job["links"]["result"], headers=anna.auth).get_json()["result"] == {"slept": 1.0}


def test_polling_is_rate_limited_per_token_with_retry_after(stack: Stack):
    from spacejobs.webapp.limits import limiter_storage

    # Counters in Redis, as in production, so every web process shares them.
    app = stack.make_app(POLL_RATE_LIMIT="3 per minute",
                         RATELIMIT_STORAGE_URI=limiter_storage(stack.redis_url))
    client = app.test_client()
    org = stack.org()
    anna, vera = stack.user(org, role="owner"), stack.user(org)
    job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth).get_json()
    answers = [client.get(job["links"]["self"], headers=anna.auth) for _ in range(4)]
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    limited = answers[-1]
    assert limited.get_json()["error"]["code"] == "rate_limited"
    assert int(limited.headers["Retry-After"]) > 0
    # The limit is per token: another member polling the same job is not affected.
    assert client.get(job["links"]["self"], headers=vera.auth).status_code == 200


def read_events(response) -> list[tuple[str, dict]]:
    return parse_events(response.get_data(as_text=True))


def parse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_events_stream_follows_status_and_progress_and_ends_at_a_terminal_state(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    client.post(f"/api/v1/orgs/{org}/projects", json={"name": "p"}, headers=anna.auth)
    with stack.workers_paused():  # a lingering worker would finish it before the stream opens
        job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "projects_export"},
                          headers=anna.auth).get_json()
        response = client.get(job["links"]["events"], headers=anna.auth)
        assert response.status_code == 200
        assert response.mimetype == "text/event-stream"
        chunks = (c.decode() if isinstance(c, bytes) else c for c in response.response)
        opening = ""
        while "event:" not in opening:
            opening += next(chunks)
    events = parse_events(opening + "".join(chunks))  # the rest ends with the stream
    statuses = [data["status"] for _, data in events]
    assert statuses[0] == "queued" and statuses[-1] == "completed"
    assert events[-1][1]["progress"] == {"stage": "writing the file", "done": 1, "total": 1}
    assert all(name in ("status", "progress") for name, _ in events)


def test_events_stream_of_another_orgs_job_is_404(stack: Stack, client):
    org, other = stack.org(), stack.org()
    anna, olga = stack.user(org, role="owner"), stack.user(other, role="owner")
    job = client.post(f"/api/v1/orgs/{org}/jobs", json={"kind": "bench.noop"}, headers=anna.auth).get_json()
    assert client.get(job["links"]["events"], headers=olga.auth).status_code == 404
    assert client.get(f"/api/v1/orgs/{other}/jobs/{job['id']}/events", headers=olga.auth).status_code == 404
