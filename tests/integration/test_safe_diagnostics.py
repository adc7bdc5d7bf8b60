"""What operators and logs keep of a failed job: the exception's classes, a database error's
SQLSTATE and where the code failed, never a value from the tenant's params or data (a
PostgreSQL error quotes the value it refused; models/diagnostics.py)."""

from __future__ import annotations

import io
import logging
import re
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from spacejobs.demo.projects import Projects
from spacejobs.models.db.transaction import transaction
from spacejobs.models.logs import ContextFormatter
from tests import kinds
from tests.conftest import submit
from tests.kinds import SECRET_MARKER
from tests.kit.stack import Stack

HTML = {"Accept": "text/html"}


def tenant_marker() -> str:
    """Text of the tenant's that no page or log may show. Searched for by its unique tail:
    PostgreSQL may quote only the part just before where it stopped."""
    return f"TENANT-MARKER-{uuid.uuid4().hex}"


def unique_part(marker: str) -> str:
    return marker.rsplit("-", 1)[1]


def operators_view(stack: Stack, client, job_id: str) -> dict[str, str]:
    """Everything an operator (or whoever reads the processes' logs) may see of the job."""
    olga = stack.operator()
    with transaction(stack.operator_db) as conn:
        rows = conn.execute(text("SELECT exception_class, traceback FROM job_diagnostics"
                                 " WHERE job_id = :id"), {"id": job_id}).all()
    page = client.get(f"/ops/jobs/{job_id}", headers=olga.auth | HTML)
    api = client.get(f"/ops/api/jobs/{job_id}", headers=olga.auth)
    assert page.status_code == api.status_code == 200
    return {"diagnostics rows": repr([tuple(row) for row in rows]),
            "/ops job page": page.get_data(as_text=True),
            "/ops/api job": api.get_data(as_text=True),
            "worker and beat logs": "".join(proc.output() for proc in stack.processes)}


@pytest.mark.parametrize("source", ["params", "data"])
def test_a_members_text_that_postgresql_refuses_reaches_no_operator_page_nor_log(
        stack: Stack, client, source):
    org = stack.org()
    vera = stack.user(org, role="member")
    marker = tenant_marker()
    if source == "data":
        assert client.post(f"/api/v1/orgs/{org}/projects", json={"name": marker},
                           headers=vera.auth).status_code == 201
    job = submit(client, org, vera, "test.cast_to_uuid",
                 {"value": marker} if source == "params" else {})
    row = stack.wait_for(job["id"], "failed", timeout=30)
    assert row["error_code"] == "internal_error"

    seen = operators_view(stack, client, job["id"])
    print(f"marker from the tenant's {source} found in:",
          [place for place, shown in seen.items() if unique_part(marker) in shown] or "nothing")
    assert all(unique_part(marker) not in shown for shown in seen.values())
    # Still worth an operator's look: what failed, PostgreSQL's reason, and where.
    page = seen["/ops job page"]
    for useful in ("sqlalchemy.exc.DataError", "psycopg.errors.InvalidTextRepresentation",
                   "SQLSTATE 22P02 invalid_text_representation", "tests/kinds.py",
                   "in cast_to_uuid"):
        assert useful in page, useful


@pytest.fixture()
def web_log():
    """The web process's log as production writes it (models.logs), text and JSON lines."""
    out = io.StringIO()
    handlers = [logging.StreamHandler(out) for _ in range(2)]
    for handler, as_json in zip(handlers, (False, True), strict=True):
        handler.setFormatter(ContextFormatter(as_json=as_json))
        logging.getLogger().addHandler(handler)
    try:
        yield out
    finally:
        for handler in handlers:
            logging.getLogger().removeHandler(handler)


def test_an_unexpected_web_error_quoting_a_members_text_is_logged_without_it(
        stack: Stack, client, web_log, monkeypatch):
    org = stack.org()
    vera = stack.user(org, role="member")
    marker = tenant_marker()

    def create_with_a_bug(self, name: str, description: str = "", **_: object):
        # As a driver or library error would: the value it choked on, in its message.
        raise ValueError(f"cannot store the project {name!r}")

    monkeypatch.setattr(Projects, "create", create_with_a_bug)
    answer = client.post(f"/api/v1/orgs/{org}/projects", json={"name": marker}, headers=vera.auth)
    assert answer.status_code == 500
    assert answer.get_json()["error"] == {"code": "internal_error",
                                          "message": "Something went wrong on our side."}
    logged = web_log.getvalue()
    print("marker in the web's log:", unique_part(marker) in logged)
    assert unique_part(marker) not in logged
    # What an operator needs to find the bug is still there.
    assert "unhandled error: builtins.ValueError" in logged
    assert "in create_with_a_bug" in logged and "test_safe_diagnostics.py" in logged


def test_a_result_postgresql_would_refuse_fails_its_own_job_alone_and_says_nothing_of_it(
        stack: Stack, client):
    """Attack: a result jsonb cannot hold (a NUL) failed the worker's whole batched finish, so
    the jobs finishing beside it, of any organization, ran again; and PostgreSQL's refusal,
    which quotes the JSON up to the NUL, reached the worker's log."""
    org, other = stack.org(), stack.org()
    vera, olga = stack.user(org, role="member"), stack.user(other, role="member")
    marker = tenant_marker()
    with stack.workers_paused():  # one drain takes them all: they finish in the same batch
        bystanders = [submit(client, other, olga, "bench.noop") for _ in range(6)]
        job = submit(client, org, vera, "test.unstorable_result", {"value": marker})
    row = stack.wait_for(job["id"], "failed", timeout=30)
    assert (row["error_code"], row["attempts"], row["result"]) == ("result_not_storable", 1, None)
    for bystander in bystanders:
        done = stack.wait_for(bystander["id"], "completed", timeout=30)
        assert done["attempts"] == 1, "a job finishing beside the unstorable one ran again"
    logs = "".join(proc.output() for proc in stack.processes)
    leaks = [line for line in logs.splitlines() if unique_part(marker) in line]
    print(f"marker in the worker's log: {len(leaks)} lines, e.g.", [line[:300] for line in leaks[:2]])
    assert leaks == []
    # The finish never sent it to PostgreSQL (test.cast_to_uuid's DataError, raised in its
    # kind, is logged with its traceback by the same workers).
    assert [record for record in log_records(logs)
            if "DataError" in record and "kind=test.cast_to_uuid" not in record] == []


def log_records(log: str) -> list[str]:
    """A process's log split into its records (each starts with its timestamp; an exception's
    traceback stays with the record that logged it)."""
    return re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} )", log)


def test_a_kind_that_raises_leaves_its_traceback_in_the_workers_log_and_no_message_anywhere(
        stack: Stack, client):
    """The worker's log is where a kind's author finds why the job failed: the frames down to
    the kind's raise. Its message (here a secret planted in it) stays out of the log, as out of
    the operators' diagnostics."""
    org = stack.org()
    vera = stack.user(org, role="member")
    job = submit(client, org, vera, "test.fail")
    stack.wait_for(job["id"], "failed", timeout=30)

    logs = "".join(proc.output() for proc in stack.processes)
    raised = [record for record in log_records(logs)
              if "job raised builtins.RuntimeError" in record and f"job_id={job['id']}" in record]
    assert len(raised) == 3, "one traceback per attempt (test.fail has 3)"
    source = Path(kinds.__file__).read_text().splitlines()
    raise_line = source.index('    raise RuntimeError(f"boom: {SECRET_MARKER}")') + 1
    for useful in (f'tests/kinds.py", line {raise_line}, in always_fails',
                   'raise RuntimeError(f"boom: {SECRET_MARKER}")',  # the source line, not its value
                   "builtins.RuntimeError (message withheld)", "kind=test.fail"):
        assert useful in raised[0], (useful, raised[0])
    assert SECRET_MARKER not in logs and "hunter2" not in logs

    seen = operators_view(stack, client, job["id"])
    assert "in always_fails" in seen["diagnostics rows"]
    assert all("hunter2" not in shown for shown in seen.values())
