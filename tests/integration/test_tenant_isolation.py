"""Tenant isolation through the HTTP API (DESIGN.md §3, §4), against a real worker.

Cross-tenant access must look exactly like a missing id: 404 with the same bytes, never 403,
never a hint that the organization, job or project exists. Bodies are strict, the lease token
never leaves the database, and organization state, role, dedup and idempotency rules hold.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import text

from spacejobs.models.db.transaction import transaction
from spacejobs.models.tenancy import accounts
from tests.kit.stack import Stack

if TYPE_CHECKING:
    from tests.kit.seeding import TestUser

API = "/api/v1"


# ----------------------------------------------------------------------------- helpers

@dataclass(frozen=True)
class Endpoint:
    name: str
    method: str
    path: str  # placeholders {org}, {job}, {project}
    body: dict[str, Any] | None = None

    @property
    def takes_id(self) -> bool:
        return "{job}" in self.path or "{project}" in self.path

    @property
    def needs_active_job(self) -> bool:
        # A cross-tenant cancel is only meaningful against a job it could still end.
        return self.name == "cancel_job"

    def url(self, org: object, job: object = None, project: object = None) -> str:
        return API + self.path.format(org=org, job=job, project=project)


ENDPOINTS = [
    Endpoint("list_jobs", "GET", "/orgs/{org}/jobs"),
    Endpoint("get_job", "GET", "/orgs/{org}/jobs/{job}"),
    Endpoint("get_job_result", "GET", "/orgs/{org}/jobs/{job}/result"),
    Endpoint("cancel_job", "POST", "/orgs/{org}/jobs/{job}/cancel"),
    Endpoint("job_events", "GET", "/orgs/{org}/jobs/{job}/events"),
    Endpoint("list_projects", "GET", "/orgs/{org}/projects"),
    Endpoint("create_project", "POST", "/orgs/{org}/projects", body={"name": "planted-by-outsider"}),
    Endpoint("get_project", "GET", "/orgs/{org}/projects/{project}"),
    Endpoint("submit_job", "POST", "/orgs/{org}/jobs", body={"kind": "projects_export"}),
    Endpoint("org_audit", "GET", "/orgs/{org}/audit"),
]
ID_ENDPOINTS = [ep for ep in ENDPOINTS if ep.takes_id]

every_endpoint = pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda ep: ep.name)
every_id_endpoint = pytest.mark.parametrize("endpoint", ID_ENDPOINTS, ids=lambda ep: ep.name)


def call(client, endpoint: Endpoint, headers: dict[str, str], *, org: object, job: object = None,
         project: object = None):
    return client.open(endpoint.url(org, job, project), method=endpoint.method, json=endpoint.body,
                       headers=headers)


def submit(client, org, user: TestUser, kind: str, params: dict | None = None, **extra) -> dict:
    body = {"kind": kind} | ({"params": params} if params is not None else {}) | extra
    answer = client.post(f"{API}/orgs/{org}/jobs", json=body, headers=user.auth)
    assert answer.status_code == 202, answer.get_json()
    return answer.get_json()


def create_project(client, org, user: TestUser, name: str) -> str:
    answer = client.post(f"{API}/orgs/{org}/projects", json={"name": name}, headers=user.auth)
    assert answer.status_code == 201, answer.get_json()
    return answer.get_json()["id"]


def error_code(answer) -> str:
    return answer.get_json()["error"]["code"]


def job_ids_in(stack: Stack, org) -> list[str]:
    """Every job row of the organization, read as the operator role (metadata only)."""
    with transaction(stack.operator_db) as conn:
        rows = conn.execute(text("SELECT id FROM jobs WHERE organization_id = :org ORDER BY id"),
                            {"org": str(org)})
        return [str(job_id) for job_id in rows.scalars()]


def snapshot(stack: Stack, org) -> tuple[list[Any], list[str]]:
    """What an outsider must not be able to change: the org's jobs and its projects."""
    with transaction(stack.operator_db) as conn:
        job_rows = conn.execute(
            text("SELECT id, status, cancel_requested_at FROM jobs WHERE organization_id = :org"
                 " ORDER BY id"), {"org": str(org)}).all()
    with transaction(stack.worker_db, organization_id=org) as conn:
        projects = [str(p) for p in conn.execute(text("SELECT id FROM projects ORDER BY id")).scalars()]
    return [tuple(row) for row in job_rows], projects


def member_404_body(client, owner: TestUser, org: object) -> bytes:
    """What a genuine member gets for a job id that does not exist in their own organization."""
    answer = client.get(f"{API}/orgs/{org}/jobs/{uuid.uuid4()}", headers=owner.auth)
    assert answer.status_code == 404 and error_code(answer) == "not_found"
    return answer.get_data()


def assert_same_404_as_missing(client, endpoint: Endpoint, user: TestUser, *, org: object,
                               job: object = None, project: object = None,
                               reference: bytes) -> None:
    """The answer is 404 and byte-identical to the answer for ids that exist nowhere, and to a
    member's 404 for a missing id (``reference``): a non-member learns nothing more."""
    answer = call(client, endpoint, user.auth, org=org, job=job, project=project)
    nowhere = call(client, endpoint, user.auth, org=uuid.uuid4(), job=uuid.uuid4(), project=uuid.uuid4())
    same_org_missing_ids = call(client, endpoint, user.auth, org=org, job=uuid.uuid4(),
                                project=uuid.uuid4())
    assert nowhere.status_code == 404 and error_code(nowhere) == "not_found"
    assert answer.status_code == 404, (answer.status_code, answer.get_data(as_text=True))
    assert answer.get_data() == nowhere.get_data()
    assert same_org_missing_ids.status_code == 404
    assert same_org_missing_ids.get_data() == nowhere.get_data()
    assert nowhere.get_data() == reference


def add_member(stack: Stack, org, user: TestUser, role: str) -> None:
    with stack.admin() as conn:
        accounts.add_member(conn, org, user.id, role)


# ----------------------------------------------------------------------------- fixtures

@dataclass
class Tenant:
    id: uuid.UUID
    owner: TestUser
    project: str
    done_job: str  # a completed projects_export: its result lists the org's projects


@pytest.fixture(scope="module")
def org_a(stack: Stack, app) -> Tenant:
    client = app.test_client()
    org = stack.org(name="tenant-a")
    owner = stack.user(org, role="owner")
    project = create_project(client, org, owner, "a-confidential-project")
    job = submit(client, org, owner, "projects_export")["id"]
    stack.wait_for(job, "completed")
    # Positive control: for A's owner every one of these ids exists.
    for path in (f"jobs/{job}", f"jobs/{job}/result", f"projects/{project}"):
        assert client.get(f"{API}/orgs/{org}/{path}", headers=owner.auth).status_code == 200
    return Tenant(org, owner, project, job)


@pytest.fixture(scope="module")
def org_b(stack: Stack, app) -> Tenant:
    client = app.test_client()
    org = stack.org(name="tenant-b")
    owner = stack.user(org, role="owner")
    project = create_project(client, org, owner, "b-project")
    job = submit(client, org, owner, "projects_export")["id"]
    stack.wait_for(job, "completed")
    return Tenant(org, owner, project, job)


@contextlib.contextmanager
def target_job(stack: Stack, client, endpoint: Endpoint, tenant: Tenant,
               requester: TestUser | None = None) -> Iterator[str]:
    """The job of ``tenant`` to aim at. For cancel: a job that is still QUEUED (workers paused),
    which a wrongly authorized cancel would end at once; its owner cancels it afterwards."""
    if not endpoint.needs_active_job:
        yield tenant.done_job
        return
    with stack.workers_paused():
        job = submit(client, tenant.id, requester or tenant.owner, "bench.noop")["id"]
        try:
            yield job
        finally:
            answer = client.post(f"{API}/orgs/{tenant.id}/jobs/{job}/cancel", headers=tenant.owner.auth)
            assert answer.status_code == 200 and answer.get_json()["status"] == "cancelled"


# ----------------------------------------------------------------------------- cross-tenant

@every_endpoint
def test_member_of_other_org_gets_404_using_org_a_ids(stack: Stack, client, org_a: Tenant,
                                                      org_b: Tenant, endpoint: Endpoint):
    with target_job(stack, client, endpoint, org_a) as job:
        before = snapshot(stack, org_a.id)
        assert_same_404_as_missing(client, endpoint, org_b.owner, org=org_a.id, job=job,
                                   project=org_a.project,
                                   reference=member_404_body(client, org_a.owner, org_a.id))
        assert snapshot(stack, org_a.id) == before


@every_id_endpoint
def test_member_of_other_org_gets_404_using_own_org_and_org_a_ids(stack: Stack, client, org_a: Tenant,
                                                                  org_b: Tenant, endpoint: Endpoint):
    with target_job(stack, client, endpoint, org_a) as job:
        before_a, before_b = snapshot(stack, org_a.id), snapshot(stack, org_b.id)
        assert_same_404_as_missing(client, endpoint, org_b.owner, org=org_b.id, job=job,
                                   project=org_a.project,
                                   reference=member_404_body(client, org_b.owner, org_b.id))
        assert snapshot(stack, org_a.id) == before_a
        assert snapshot(stack, org_b.id) == before_b


@every_endpoint
def test_user_without_any_membership_gets_404(stack: Stack, client, org_a: Tenant, endpoint: Endpoint):
    nobody = stack.user()
    with target_job(stack, client, endpoint, org_a) as job:
        before = snapshot(stack, org_a.id)
        assert_same_404_as_missing(client, endpoint, nobody, org=org_a.id, job=job,
                                   project=org_a.project,
                                   reference=member_404_body(client, org_a.owner, org_a.id))
        assert snapshot(stack, org_a.id) == before


@every_endpoint
def test_removed_member_gets_404_even_for_own_job_and_project(stack: Stack, client, org_a: Tenant,
                                                              org_b: Tenant, endpoint: Endpoint):
    # Still a valid user with another membership: only the membership in A is gone.
    former = stack.user(org_a.id, role="admin")
    add_member(stack, org_b.id, former, "member")
    project = create_project(client, org_a.id, former, "made-by-former-member")
    with stack.workers_paused() if endpoint.needs_active_job else contextlib.nullcontext():
        job = submit(client, org_a.id, former, "bench.noop" if endpoint.needs_active_job
                     else "projects_export")["id"]
        if not endpoint.needs_active_job:
            stack.wait_for(job, "completed")
        stack.remove_member(org_a.id, former.id)
        before = snapshot(stack, org_a.id)
        assert_same_404_as_missing(client, endpoint, former, org=org_a.id, job=job, project=project,
                                   reference=member_404_body(client, org_a.owner, org_a.id))
        assert snapshot(stack, org_a.id) == before
        if endpoint.needs_active_job:
            assert stack.job_row(job)["status"] == "queued"
            answer = client.post(f"{API}/orgs/{org_a.id}/jobs/{job}/cancel", headers=org_a.owner.auth)
            assert answer.status_code == 200


def test_removed_member_cannot_fetch_result(stack: Stack, client, org_a: Tenant):
    member = stack.user(org_a.id, role="member")
    job = submit(client, org_a.id, member, "projects_export")
    stack.wait_for(job["id"], "completed")
    url = f"{API}/orgs/{org_a.id}/jobs/{job['id']}/result"
    assert client.get(url, headers=member.auth).status_code == 200

    stack.remove_member(org_a.id, member.id)

    answer = client.get(url, headers=member.auth)
    missing = client.get(f"{API}/orgs/{org_a.id}/jobs/{uuid.uuid4()}/result", headers=member.auth)
    assert answer.status_code == 404
    assert answer.get_data() == missing.get_data() == member_404_body(client, org_a.owner, org_a.id)
    assert b"a-confidential-project" not in answer.get_data()


@every_endpoint
@pytest.mark.parametrize("bad_id", ["1", "not-a-uuid", "00000000-0000-0000-0000-00000000000g"])
def test_non_uuid_ids_are_404_like_a_missing_id(client, org_b: Tenant, endpoint: Endpoint, bad_id: str):
    nowhere = call(client, endpoint, org_b.owner.auth, org=uuid.uuid4(), job=uuid.uuid4(),
                   project=uuid.uuid4())
    as_org = call(client, endpoint, org_b.owner.auth, org=bad_id, job=org_b.done_job,
                  project=org_b.project)
    assert nowhere.get_data() == member_404_body(client, org_b.owner, org_b.id)
    assert as_org.status_code == 404 and as_org.get_data() == nowhere.get_data()
    if endpoint.takes_id:
        as_id = call(client, endpoint, org_b.owner.auth, org=org_b.id, job=bad_id, project=bad_id)
        assert as_id.status_code == 404 and as_id.get_data() == nowhere.get_data()


# ----------------------------------------------------------------------------- strict bodies

@pytest.mark.parametrize("field", ["organization_id", "requested_by", "lease_token"])
def test_submit_with_unknown_field_is_400_and_creates_nothing(stack: Stack, client, org_b: Tenant,
                                                              field: str):
    org = stack.org()
    owner = stack.user(org, role="owner")
    # Values pointing at another tenant, as an attacker would send them.
    value = {"organization_id": str(org_b.id), "requested_by": str(org_b.owner.id)}.get(field, 1)
    before_b = job_ids_in(stack, org_b.id)

    answer = client.post(f"{API}/orgs/{org}/jobs", json={"kind": "projects_export", field: value},
                         headers=owner.auth)

    assert answer.status_code == 400
    assert error_code(answer) == "invalid_request"
    assert answer.get_json()["error"]["fields"] == [field]
    assert job_ids_in(stack, org) == []
    assert job_ids_in(stack, org_b.id) == before_b
    assert client.get(f"{API}/orgs/{org}/jobs", headers=owner.auth).get_json()["jobs"] == []


def test_create_project_with_unknown_field_is_400_and_creates_nothing(stack: Stack, client,
                                                                      org_b: Tenant):
    org = stack.org()
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/projects",
                         json={"name": "x", "organization_id": str(org_b.id)}, headers=owner.auth)
    assert answer.status_code == 400 and error_code(answer) == "invalid_request"
    assert client.get(f"{API}/orgs/{org}/projects", headers=owner.auth).get_json()["projects"] == []
    assert snapshot(stack, org)[1] == []


@pytest.mark.parametrize(("body", "code"), [
    ({"kind": "no_such_kind"}, "unknown_kind"),
    ({"kind": "projects_import"}, "invalid_params"),
    ({"kind": "projects_import", "params": {"projects": []}}, "invalid_params"),
    ({"kind": "bench.sleep", "params": {"seconds": 61}}, "invalid_params"),
    ({"kind": "bench.sleep", "params": {"seconds": 1, "organization_id": "x"}}, "invalid_params"),
], ids=["unknown-kind", "import-without-projects", "import-empty", "sleep-61s", "params-extra-field"])
def test_submit_with_bad_kind_or_params_is_400_and_creates_nothing(stack: Stack, client, body, code):
    org = stack.org()
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/jobs", json=body, headers=owner.auth)
    assert answer.status_code == 400
    assert error_code(answer) == code
    assert job_ids_in(stack, org) == []


@pytest.mark.parametrize(("data", "content_type"), [
    ("kind=projects_export", "application/x-www-form-urlencoded"),
    ("projects_export", "text/plain"),
    ('{"kind": "projects_export"', "application/json"),
    ('["projects_export"]', "application/json"),
    ("", "application/json"),
], ids=["form", "text", "broken-json", "json-array", "empty"])
def test_submit_with_non_json_object_body_is_400_invalid_request(stack: Stack, client, data,
                                                                  content_type):
    org = stack.org()
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/jobs", data=data, content_type=content_type,
                         headers=owner.auth)
    assert answer.status_code == 400
    assert error_code(answer) == "invalid_request"
    assert job_ids_in(stack, org) == []


# ----------------------------------------------------------------------------- lease token

def test_lease_token_never_appears_in_any_response(stack: Stack, client):
    org = stack.org()
    anna = stack.user(org, role="owner")
    responses: list[tuple[str, Any, str]] = []

    def capture(label: str, answer) -> Any:
        # Read the body now: a streamed (events) body cannot be read once the request is gone.
        responses.append((label, answer, answer.get_data(as_text=True)))
        return answer

    def read_everything(label: str, job_id: str, *, finished: bool = False) -> None:
        base = f"{API}/orgs/{org}/jobs"
        if finished:  # the events stream only ends (and can be read whole) at a terminal state
            capture(f"{label} events", client.get(f"{base}/{job_id}/events", headers=anna.auth))
        capture(f"{label} list", client.get(base, headers=anna.auth))
        capture(f"{label} get", client.get(f"{base}/{job_id}", headers=anna.auth))
        capture(f"{label} result", client.get(f"{base}/{job_id}/result", headers=anna.auth))
        capture(f"{label} me", client.get(f"{API}/me", headers=anna.auth))

    submitted = capture("submit", client.post(f"{API}/orgs/{org}/jobs", headers=anna.auth, json={
        "kind": "bench.sleep", "params": {"seconds": 1.5}}))
    job = submitted.get_json()["id"]
    token = stack.wait_for(job, "leased")["lease_token"]
    read_everything("leased", job)
    assert responses[-2][1].status_code == 409  # result while running: job_not_completed
    assert stack.job_row(job)["lease_token"] == token, "the reads must happen while the lease is held"

    # A second running job, asked to cancel while it holds its lease.
    other = submit(client, org, anna, "bench.sleep", {"seconds": 30})["id"]
    other_token = stack.wait_for(other, "leased")["lease_token"]
    cancel = capture("cancel running", client.post(f"{API}/orgs/{org}/jobs/{other}/cancel",
                                                   headers=anna.auth))
    assert cancel.status_code == 202 and cancel.get_json()["status"] == "cancel_requested"
    read_everything("cancel_requested", other)
    assert stack.job_row(other)["lease_token"] == other_token

    stack.wait_for(job, "completed")
    read_everything("completed", job, finished=True)
    assert responses[-2][1].status_code == 200
    finished = capture("cancel finished", client.post(f"{API}/orgs/{org}/jobs/{job}/cancel",
                                                      headers=anna.auth))
    assert finished.status_code == 409 and error_code(finished) == "job_finished"
    stack.wait_for(other, "cancelled")
    read_everything("cancelled", other, finished=True)

    assert token is not None and other_token is not None
    for secret in (token, other_token):
        for form in (str(secret), secret.hex, str(secret).upper(), secret.hex.upper()):
            for label, answer, body in responses:
                assert form not in body, label
                for name, value in answer.headers.items():
                    assert form not in value, (label, name)
    for label, _answer, body in responses:
        assert "lease_token" not in body, label
    assert any(label == "completed events" and "event: status" in body for label, _, body in responses)


# ----------------------------------------------------------------------------- authentication

BAD_AUTH = {
    "no-header": {},
    "empty-bearer": {"Authorization": "Bearer "},
    "unknown-token": {"Authorization": "Bearer sj_" + "x" * 43},
    "not-our-prefix": {"Authorization": "Bearer abc.def.ghi"},
    "basic-scheme": {"Authorization": "Basic dXNlcjpwYXNz"},
}


@pytest.mark.parametrize("headers", list(BAD_AUTH.values()), ids=list(BAD_AUTH))
@pytest.mark.parametrize("endpoint", [*ENDPOINTS, Endpoint("me", "GET", "/me")], ids=lambda ep: ep.name)
def test_missing_or_bad_bearer_token_is_401(client, org_a: Tenant, endpoint: Endpoint, headers):
    answer = call(client, endpoint, headers, org=org_a.id, job=org_a.done_job, project=org_a.project)
    assert answer.status_code == 401
    body = answer.get_json()
    assert body["error"]["code"] == "unauthorized"
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "a-confidential-project" not in answer.get_data(as_text=True)


def test_revoked_token_is_401(stack: Stack, client, org_a: Tenant):
    member = stack.user(org_a.id, role="member")
    assert client.get(f"{API}/me", headers=member.auth).status_code == 200
    with stack.admin() as conn:
        conn.execute(text("UPDATE api_tokens SET revoked_at = now() WHERE user_id = :user"),
                     {"user": member.id})
    answer = client.get(f"{API}/orgs/{org_a.id}/jobs", headers=member.auth)
    assert answer.status_code == 401 and error_code(answer) == "unauthorized"


# ----------------------------------------------------------------------------- /me

def test_me_lists_only_the_users_own_memberships(stack: Stack, client, org_a: Tenant, org_b: Tenant):
    third = stack.org(name="tenant-c")
    carla = stack.user(org_a.id, role="admin")
    add_member(stack, third, carla, "member")
    stack.user(third, role="owner")  # someone else in a shared org

    body = client.get(f"{API}/me", headers=carla.auth).get_json()

    assert body["user"]["id"] == str(carla.id) and body["user"]["email"] == carla.email
    assert sorted((m["organization_id"], m["role"]) for m in body["memberships"]) == sorted(
        [(str(org_a.id), "admin"), (str(third), "member")])
    assert str(org_b.id) not in str(body)
    assert client.get(f"{API}/me", headers=stack.user().auth).get_json()["memberships"] == []


# ----------------------------------------------------------------------------- organization states

def test_read_only_org_refuses_new_projects(stack: Stack, client):
    org = stack.org(state="read_only")
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/projects", json={"name": "x"}, headers=owner.auth)
    assert answer.status_code == 409 and error_code(answer) == "organization_read_only"
    assert snapshot(stack, org)[1] == []


def test_read_only_org_refuses_import(stack: Stack, client):
    org = stack.org(state="read_only")
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/jobs", headers=owner.auth,
                         json={"kind": "projects_import", "params": {"projects": [{"name": "x"}]}})
    assert answer.status_code == 409 and error_code(answer) == "organization_read_only"
    assert job_ids_in(stack, org) == []


def test_read_only_org_still_exports_to_completion(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    create_project(client, org, owner, "take-me-out")
    stack.set_state(org, "read_only")

    job = submit(client, org, owner, "projects_export")
    assert stack.wait_for(job["id"], "completed", "failed")["status"] == "completed"
    result = client.get(job["links"]["result"], headers=owner.auth).get_json()["result"]
    assert [p["name"] for p in result["projects"]] == ["take-me-out"]


@pytest.mark.parametrize("kind", ["projects_export", "bench.noop"])
def test_deleting_org_refuses_submit(stack: Stack, client, kind: str):
    org = stack.org(state="deleting")
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/jobs", json={"kind": kind}, headers=owner.auth)
    assert answer.status_code == 409 and error_code(answer) == "organization_unavailable"
    assert job_ids_in(stack, org) == []


def test_deleting_org_refuses_new_projects(stack: Stack, client):
    org = stack.org(state="deleting")
    owner = stack.user(org, role="owner")
    answer = client.post(f"{API}/orgs/{org}/projects", json={"name": "x"}, headers=owner.auth)
    assert answer.status_code == 409 and error_code(answer) == "organization_unavailable"


@pytest.fixture(scope="module")
def deleted_org(stack: Stack, app) -> Tenant:
    """An organization with a project and a completed job, then marked deleted."""
    client = app.test_client()
    org = stack.org()
    owner = stack.user(org, role="owner")
    project = create_project(client, org, owner, "left-behind")
    job = submit(client, org, owner, "projects_export")["id"]
    stack.wait_for(job, "completed")
    stack.set_state(org, "deleted")
    return Tenant(org, owner, project, job)


@every_endpoint
def test_deleted_org_answers_409_unavailable_everywhere_and_shows_nothing(
        stack: Stack, client, deleted_org: Tenant, endpoint: Endpoint):
    """Its members know it existed, so 404 would hide nothing; 409 says why (the issue asks
    409 for submits), and no endpoint shows or changes what is left of it."""
    before = snapshot(stack, deleted_org.id)
    answer = call(client, endpoint, deleted_org.owner.auth, org=deleted_org.id,
                  job=deleted_org.done_job, project=deleted_org.project)
    assert answer.status_code == 409, answer.get_data(as_text=True)
    assert error_code(answer) == "organization_unavailable"
    assert "left-behind" not in answer.get_data(as_text=True)
    assert snapshot(stack, deleted_org.id) == before


# ----------------------------------------------------------------------------- roles

def test_plain_member_cannot_submit_import(stack: Stack, client):
    org = stack.org()
    member = stack.user(org, role="member")
    admin = stack.user(org, role="admin")
    body = {"kind": "projects_import", "params": {"projects": [{"name": "imported"}]}}

    answer = client.post(f"{API}/orgs/{org}/jobs", json=body, headers=member.auth)

    assert answer.status_code == 403 and error_code(answer) == "insufficient_role"
    assert job_ids_in(stack, org) == []
    allowed = client.post(f"{API}/orgs/{org}/jobs", json=body, headers=admin.auth)
    assert allowed.status_code == 202
    assert stack.wait_for(allowed.get_json()["id"], "completed", "failed")["status"] == "completed"


# ----------------------------------------------------------------------------- dedup / idempotency

def test_active_duplicate_is_409_naming_the_first_job(stack: Stack, client, org_b: Tenant):
    org = stack.org()
    owner = stack.user(org, role="owner")
    body = {"kind": "bench.noop", "dedup_key": "nightly"}
    url = f"{API}/orgs/{org}/jobs"
    with stack.workers_paused():  # the first job stays queued, i.e. active
        first = client.post(url, json=body, headers=owner.auth)
        assert first.status_code == 202
        first_id = first.get_json()["id"]

        again = client.post(url, json=body, headers=owner.auth)

        assert again.status_code == 409
        assert again.get_json()["error"]["code"] == "duplicate_job"
        assert again.get_json()["error"]["job_id"] == first_id
        assert job_ids_in(stack, org) == [first_id]

        # The same key in another organization is another tenant's business: no conflict, no leak.
        elsewhere = client.post(f"{API}/orgs/{org_b.id}/jobs", json=body, headers=org_b.owner.auth)
        assert elsewhere.status_code == 202 and elsewhere.get_json()["id"] != first_id

        # Once the first is no longer active the key is free again.
        assert client.post(f"{url}/{first_id}/cancel", headers=owner.auth).status_code == 200
        later = client.post(url, json=body, headers=owner.auth)
        assert later.status_code == 202 and later.get_json()["id"] != first_id


def test_idempotency_key_replay_returns_the_same_job_once(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    url = f"{API}/orgs/{org}/jobs"
    body = {"kind": "bench.sleep", "params": {"seconds": 0.1}}
    headers = owner.auth | {"Idempotency-Key": "submit-42"}

    first = client.post(url, json=body, headers=headers)
    replay = client.post(url, json=body, headers=headers)

    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    assert replay.status_code == 202
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.get_json()["id"] == first.get_json()["id"]
    assert replay.headers["Location"] == first.headers["Location"]
    assert job_ids_in(stack, org) == [first.get_json()["id"]]
    # Still the same job after it ran.
    stack.wait_for(first.get_json()["id"], "completed")
    late = client.post(url, json=body, headers=headers)
    assert late.status_code == 202 and late.get_json()["id"] == first.get_json()["id"]
    assert job_ids_in(stack, org) == [first.get_json()["id"]]


def test_idempotency_key_reused_with_different_params_is_409(stack: Stack, client):
    org = stack.org()
    owner = stack.user(org, role="owner")
    url = f"{API}/orgs/{org}/jobs"
    headers = owner.auth | {"Idempotency-Key": "submit-43"}
    first = client.post(url, json={"kind": "bench.sleep", "params": {"seconds": 0.1}}, headers=headers)
    assert first.status_code == 202

    other_params = client.post(url, json={"kind": "bench.sleep", "params": {"seconds": 0.2}},
                               headers=headers)
    other_kind = client.post(url, json={"kind": "bench.noop"}, headers=headers)

    for answer in (other_params, other_kind):
        assert answer.status_code == 409
        assert error_code(answer) == "idempotency_key_reused"
    assert job_ids_in(stack, org) == [first.get_json()["id"]]


def test_idempotency_key_is_scoped_to_the_organization(stack: Stack, client):
    """The same user and key in two organizations: two jobs; a replay never crosses tenants."""
    one, two = stack.org(), stack.org()
    owner = stack.user(one, role="owner")
    add_member(stack, two, owner, "owner")
    headers = owner.auth | {"Idempotency-Key": "same-key"}
    body = {"kind": "bench.noop"}

    in_one = client.post(f"{API}/orgs/{one}/jobs", json=body, headers=headers)
    in_two = client.post(f"{API}/orgs/{two}/jobs", json=body, headers=headers)

    assert in_one.status_code == in_two.status_code == 202
    assert "Idempotent-Replayed" not in in_two.headers
    assert in_two.get_json()["organization_id"] == str(two)
    assert job_ids_in(stack, one) == [in_one.get_json()["id"]]
    assert job_ids_in(stack, two) == [in_two.get_json()["id"]]


def test_strangers_get_401_before_any_validation_tells_them_what_exists(stack: Stack, client):
    org = stack.org()
    for body in ({"kind": "no_such_kind"}, {"kind": "projects_export", "organization_id": "x"}, {}):
        answer = client.post(f"{API}/orgs/{org}/jobs", json=body)
        assert answer.status_code == 401 and error_code(answer) == "unauthorized"
    assert client.post(f"{API}/orgs/{org}/projects", json={"bogus": 1}).status_code == 401
