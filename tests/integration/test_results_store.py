"""Large results in the results store, end to end: real PostgreSQL, real worker and beat
processes, the local store in this module's temporary directory.

Each test starts the processes it needs and retires them, so a stalled or killed worker of one
test never serves another's jobs.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from spacejobs.demo.projects import Projects
from spacejobs.models.db.transaction import transaction
from spacejobs.models.results.s3 import S3ResultStore
from spacejobs.models.results.store import new_key
from spacejobs.models.results.sweep import sweep_orphans
from tests.conftest import csrf_of, sign_in, submit
from tests.integration.leasing import claim_one
from tests.kit.processes import LoggedProcess
from tests.kit.seeding import TestUser
from tests.kit.stack import Stack, wait_until
from tests.s3server import CREDENTIALS, REGION, new_bucket, s3_client, s3_server

#: a worker of this module keeps JSON results over 2,000 bytes in the store
INLINE_MAX = "2000"


@pytest.fixture()
def worker(bare_stack: Stack) -> Iterator[LoggedProcess]:
    proc = bare_stack.start_worker(SPACEJOBS_RESULT_INLINE_MAX_BYTES=INLINE_MAX)
    yield proc
    if proc in bare_stack.processes:  # a test may have retired it itself
        bare_stack.retire(proc)


def seed_projects(stack: Stack, org: uuid.UUID, count: int) -> list[str]:
    with stack.admin() as conn:
        projects = Projects(conn, org)
        return [str(projects.create(f"Project {i:03}", "d" * 100).id) for i in range(count)]


def files_of(stack: Stack, job_id: object) -> list[str]:
    return sorted(found.key for found in stack.results().list() if f"/{job_id}/" in found.key)


def file_bytes(stack: Stack, key: str) -> bytes:
    return b"".join(stack.results().open(key).chunks())


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


# ------------------------------------------------------------------------- large results

def test_a_large_export_goes_to_the_store_and_downloads_intact(bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner", password="a good long password")
    seed_projects(stack, org, 40)
    client = stack.make_app().test_client()
    job = submit(client, org, anna, "projects_export")
    row = stack.wait_for(job["id"], "completed")

    ref = row["result_ref"]
    assert ref and ref.startswith(f"{org}/{job['id']}/") and files_of(stack, job["id"]) == [ref]
    assert row["result"]["stored"]["form"] == "json"
    stored = file_bytes(stack, ref)
    assert len(stored) > int(INLINE_MAX) and row["result"]["stored"]["size"] == len(stored)

    # The API keeps the shape of an inline result: a client never sees the threshold.
    answer = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/result", headers=anna.auth)
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    assert answer.data.endswith(stored + b"}")
    assert int(answer.headers["Content-Length"]) == len(answer.data)
    body = answer.get_json()
    assert (body["job_id"], body["kind"]) == (job["id"], "projects_export")
    assert body["result"] == json.loads(stored) and len(body["result"]["projects"]) == 40

    # The people's download is the file itself, byte for byte.
    pages = stack.make_app().test_client()
    sign_in(pages, anna)
    download = pages.get(f"/orgs/{org}/jobs/{job['id']}/download")
    assert download.status_code == 200 and download.data == stored
    assert download.mimetype == "application/json"
    assert download.headers["Content-Disposition"] == (
        f'attachment; filename="projects_export-{job["id"]}.json"')


def test_a_small_export_stays_inline(bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    seed_projects(stack, org, 2)
    client = stack.make_app().test_client()
    job = submit(client, org, anna, "projects_export")
    row = stack.wait_for(job["id"], "completed")
    assert row["result_ref"] is None and files_of(stack, job["id"]) == []
    assert len(row["result"]["projects"]) == 2


def test_the_archive_zip_opens_and_holds_every_project(bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org = stack.org()
    vera = stack.user(org, role="member")
    ids = seed_projects(stack, org, 7)
    stack.set_state(org, "read_only")  # like the export: taking one's data out always works
    client = stack.make_app().test_client()
    job = submit(client, org, vera, "projects_archive")
    row = stack.wait_for(job["id"], "completed")
    assert row["progress"] == {"stage": "writing the archive", "done": 7, "total": 7}
    assert files_of(stack, job["id"]) == [row["result_ref"]]

    answer = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/result", headers=vera.auth)
    assert answer.status_code == 200 and answer.mimetype == "application/zip"
    disposition = answer.headers["Content-Disposition"]
    assert disposition.startswith('attachment; filename="projects-') and disposition.endswith('.zip"')
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.data == file_bytes(stack, row["result_ref"])

    with zipfile.ZipFile(io.BytesIO(answer.data)) as archive:
        assert archive.testzip() is None
        assert sorted(archive.namelist()) == sorted(
            ["manifest.json", *(f"projects/{pid}.json" for pid in ids)])
        manifest = json.loads(archive.read("manifest.json"))
        assert manifest["count"] == 7 and manifest["organization_id"] == str(org)
        assert sorted(p["id"] for p in manifest["projects"]) == sorted(ids)
        listed = client.get(f"/api/v1/orgs/{org}/projects", headers=vera.auth).get_json()["projects"]
        for project in listed:
            assert json.loads(archive.read(f"projects/{project['id']}.json")) == project


def test_the_archive_goes_through_an_s3_bucket_when_the_settings_say_so(bare_stack: Stack):
    stack = bare_stack
    org = stack.org()
    vera = stack.user(org, role="member")
    seed_projects(stack, org, 3)
    with s3_server() as endpoint:
        bucket = new_bucket(endpoint)
        s3 = stack.start_worker(concurrency=1, SPACEJOBS_RESULTS_STORE="s3",
                                SPACEJOBS_S3_BUCKET=bucket, SPACEJOBS_S3_PREFIX="results",
                                SPACEJOBS_S3_ENDPOINT_URL=endpoint, SPACEJOBS_S3_REGION=REGION,
                                **CREDENTIALS)
        store = S3ResultStore(s3_client(endpoint), bucket, prefix="results")
        client = stack.make_app(RESULTS_STORE=store).test_client()
        job = submit(client, org, vera, "projects_archive")
        ref = stack.wait_for(job["id"], "completed")["result_ref"]
        assert files_of(stack, job["id"]) == []  # nothing in the local directory
        [listed] = s3_client(endpoint).list_objects_v2(Bucket=bucket)["Contents"]
        assert listed["Key"] == f"results/{ref}"
        answer = client.get(f"/api/v1/orgs/{org}/jobs/{job['id']}/result", headers=vera.auth)
        assert answer.status_code == 200 and answer.mimetype == "application/zip"
        with zipfile.ZipFile(io.BytesIO(answer.data)) as archive:
            assert len(archive.namelist()) == 4  # three projects and the manifest
        stack.retire(s3)


def test_a_person_starts_the_archive_from_the_jobs_page_and_downloads_the_zip(
        bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner", password="anna's long password")
    seed_projects(stack, org, 2)
    pages = stack.make_app().test_client()
    sign_in(pages, anna)
    jobs = pages.get(f"/orgs/{org}/jobs")
    assert "Archive projects (ZIP)" in jobs.get_data(as_text=True)
    started = pages.post(f"/orgs/{org}/jobs", data={"kind": "projects_archive", "csrf": csrf_of(jobs)})
    assert started.status_code == 302
    job_id = started.headers["Location"].rstrip("/").rsplit("/", 1)[1]
    stack.wait_for(job_id, "completed")
    page = pages.get(f"/orgs/{org}/jobs/{job_id}").get_data(as_text=True)
    assert "Download the result" in page
    download = pages.get(f"/orgs/{org}/jobs/{job_id}/download")
    assert download.status_code == 200 and download.mimetype == "application/zip"
    with zipfile.ZipFile(io.BytesIO(download.data)) as archive:
        assert len(archive.namelist()) == 3


# ------------------------------------------------------------------------- who may download

def test_a_download_is_refused_to_a_removed_member_another_organization_and_a_lower_role(
        bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org, other = stack.org(), stack.org()
    anna = stack.user(org, role="owner")
    vera = stack.user(org, role="member", password="vera's long password")
    carl = stack.user(org, role="member", password="carl's long password")
    boris = stack.user(other, role="owner")
    seed_projects(stack, org, 3)
    client = stack.make_app().test_client()
    archive = submit(client, org, anna, "projects_archive")
    for_admins = submit(client, org, anna, "test.admin_file")
    stack.wait_for(archive["id"], "completed")
    stack.wait_for(for_admins["id"], "completed")

    def api(user: TestUser, org_id: uuid.UUID, job: dict) -> int:
        return client.get(f"/api/v1/orgs/{org_id}/jobs/{job['id']}/result", headers=user.auth).status_code

    vera_pages, carl_pages = stack.make_app().test_client(), stack.make_app().test_client()
    sign_in(vera_pages, vera)
    sign_in(carl_pages, carl)
    vera_download = f"/orgs/{org}/jobs/{archive['id']}/download"
    assert api(vera, org, archive) == 200 and vera_pages.get(vera_download).status_code == 200

    # Another organization: the job does not exist, under either organization's URL.
    assert api(boris, other, archive) == 404
    assert api(boris, org, archive) == 404
    # A member without the kind's role: the job is theirs to see, its result is not.
    assert api(carl, org, for_admins) == 403
    assert carl_pages.get(f"/orgs/{org}/jobs/{for_admins['id']}/download").status_code == 403
    assert api(anna, org, for_admins) == 200
    # Removed: the very next request is a stranger's, by token and by session alike.
    stack.remove_member(org, vera.id)
    assert api(vera, org, archive) == 404
    refused = vera_pages.get(vera_download)
    assert refused.status_code == 404 and b"PK" not in refused.data


# ------------------------------------------------------------------------- no file left behind

def first_attempt_with_its_file(stack: Stack, *, stall_seconds: float) -> tuple[LoggedProcess, dict, str]:
    """A worker of its own running test.stall_file's first attempt, stalled after writing its
    file: (the worker, the job, the file's key)."""
    org = stack.org()
    anna = stack.user(org, role="owner")
    first = stack.start_worker(concurrency=1)
    job = submit(stack.make_app().test_client(), org, anna, "test.stall_file",
                 {"seconds": stall_seconds})
    try:
        wait_until(lambda: files_of(stack, job["id"]), what="the first attempt's file")
    except AssertionError:
        stack.retire(first)  # not left to claim the next tests' jobs
        raise
    [written] = files_of(stack, job["id"])
    return first, job, written


def test_a_stale_finish_leaves_no_file_behind(bare_stack: Stack):
    stack = bare_stack
    first, job, stale_file = first_attempt_with_its_file(stack, stall_seconds=4)
    first.signal_group(signal.SIGSTOP)  # heartbeats stop with it: the lease runs out
    try:
        stack.wait_for_lease_to_run_out(job["id"])
        second = stack.start_worker(concurrency=1)
        beat = stack.start_beat()
        done = stack.wait_for(job["id"], "completed", timeout=30)
    finally:
        first.signal_group(signal.SIGCONT)
    assert done["attempts"] == 2 and done["result_ref"] != stale_file
    assert file_bytes(stack, done["result_ref"]) == b"attempt 2"
    # The first attempt wakes up, returns its file, and its finish is refused by the fence.
    first.wait_for_log("stale finish discarded", timeout=20)
    assert files_of(stack, job["id"]) == [done["result_ref"]]
    assert stack.job_row(job["id"])["result_ref"] == done["result_ref"]
    stack.retire(first, second, beat)


def test_a_worker_killed_between_its_write_and_its_finish_leaves_an_orphan_the_sweep_removes(
        bare_stack: Stack):
    stack = bare_stack
    first, job, orphan = first_attempt_with_its_file(stack, stall_seconds=30)
    stack.retire(first)  # SIGKILL: no finish, no clean-up
    second = stack.start_worker(concurrency=1)
    beat = stack.start_beat()  # re-queues the expired lease; its orphan grace is the default hour
    done = stack.wait_for(job["id"], "completed", timeout=30)
    assert done["attempts"] == 2 and done["result_ref"] != orphan
    assert files_of(stack, job["id"]) == sorted([orphan, done["result_ref"]])
    # A sweep with no grace, once nothing is being written: with the second attempt running
    # it would also take that attempt's file between its write and its finish (not yet
    # referenced by the row), which is what the grace is for.
    stack.retire(second, beat)
    sweeper = stack.start_beat(SPACEJOBS_RESULTS_ORPHAN_GRACE="0",
                               SPACEJOBS_RESULTS_SWEEP_INTERVAL="0.5")
    wait_until(lambda: files_of(stack, job["id"]) == [done["result_ref"]], what="the orphan's removal")
    assert file_bytes(stack, done["result_ref"]) == b"attempt 2"
    stack.retire(sweeper)


# ------------------------------------------------------------------------- retention

def test_retention_deletes_the_file_with_the_result_and_with_the_job(
        bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    org = stack.org()
    anna = stack.user(org, role="owner")
    seed_projects(stack, org, 2)
    client = stack.make_app().test_client()
    kept_result = submit(client, org, anna, "projects_archive")
    ref = stack.wait_for(kept_result["id"], "completed")["result_ref"]
    assert files_of(stack, kept_result["id"]) == [ref]

    # Results older than about a second are dropped: the row stays, the file goes.
    stack.set_retention(results_days=0.00001)
    beat = stack.start_beat()
    wait_until(lambda: stack.job_row(kept_result["id"])["result_expired_at"] is not None,
               what="the result's expiry")
    assert stack.job_row(kept_result["id"])["result_ref"] is None
    wait_until(lambda: files_of(stack, kept_result["id"]) == [], what="the file's deletion")
    answer = client.get(f"/api/v1/orgs/{org}/jobs/{kept_result['id']}/result", headers=anna.auth)
    assert answer.status_code == 410 and answer.get_json()["error"]["code"] == "result_expired"
    stack.retire(beat)

    # Jobs older than about a second are deleted, and their files with them.
    deleted = submit(client, org, anna, "projects_archive")
    stack.wait_for(deleted["id"], "completed")
    assert len(files_of(stack, deleted["id"])) == 1
    stack.set_retention(results_days=7, jobs_days=0.00001)
    beat = stack.start_beat()

    def row_gone() -> bool:
        with stack.admin() as conn:
            return conn.execute(text("SELECT count(*) FROM jobs WHERE id = :id"),
                                {"id": deleted["id"]}).scalar() == 0

    wait_until(row_gone, what="the job's deletion")
    wait_until(lambda: files_of(stack, deleted["id"]) == [], what="the file's deletion")
    stack.retire(beat)


# ------------------------------------------------------------------------- the orphan sweep

def test_the_orphan_sweep_keeps_store_and_rows_consistent_both_ways(bare_stack: Stack, worker: LoggedProcess):
    stack = bare_stack
    store = stack.results()
    org = stack.org()
    anna = stack.user(org, role="owner")
    seed_projects(stack, org, 1)
    client = stack.make_app().test_client()
    referenced = submit(client, org, anna, "projects_archive")
    missing = submit(client, org, anna, "projects_archive")
    referenced_ref = stack.wait_for(referenced["id"], "completed")["result_ref"]
    missing_ref = stack.wait_for(missing["id"], "completed")["result_ref"]
    store.delete(missing_ref)
    stack.retire(worker)
    running = submit(client, org, anna, "bench.noop")
    with transaction(stack.worker_db) as conn:
        leased = claim_one(conn, "sweep-test")
    assert leased is not None and str(leased.id) == running["id"]

    hour = 3600
    old_orphan = new_key(org, uuid.UUID(referenced["id"]))  # an earlier attempt's leftover
    young_orphan = new_key(org, uuid.uuid4())
    running_file = new_key(org, leased.id)  # its attempt may still finish with it
    for key in (old_orphan, young_orphan, running_file):
        store.put(key, b"x", content_type="text/plain")
    partial = store.root / str(org) / str(uuid.uuid4()) / f".{'a' * 22}.tmp1234_x.part"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(b"half a file")
    foreign = store.root / "README.txt"
    foreign.write_text("not ours")
    for key in (old_orphan, running_file, referenced_ref):
        age(store._path(key), 2 * hour)
    for path in (partial, foreign):
        age(path, 2 * hour)

    report = sweep_orphans(stack.worker_db, store, grace=hour)

    left = {found.key for found in store.list()}
    assert old_orphan not in left and not partial.exists()
    assert {young_orphan, running_file, referenced_ref, "README.txt"} <= left
    assert (report.deleted, report.young, report.foreign) == (2, 1, 1)
    assert report.missing == [uuid.UUID(missing["id"])]
    # The row whose file is gone answers a clear error, not a broken download.
    answer = client.get(f"/api/v1/orgs/{org}/jobs/{missing['id']}/result", headers=anna.auth)
    assert answer.status_code == 410 and answer.get_json()["error"]["code"] == "result_missing"
    ok = client.get(f"/api/v1/orgs/{org}/jobs/{referenced['id']}/result", headers=anna.auth)
    assert ok.status_code == 200 and ok.mimetype == "application/zip"


def test_the_orphan_sweep_gives_the_worker_no_read_of_results(bare_stack: Stack):
    """The worker asks through two functions; it still may not read result or result_ref."""
    with transaction(bare_stack.worker_db) as conn:
        for column in ("result", "result_ref"):
            with pytest.raises(Exception, match="permission denied"), conn.begin_nested():
                conn.execute(text(f"SELECT {column} FROM jobs LIMIT 1"))

