"""Start a job from a view of your own Flask application, and show how it is doing.

The job API is built once per process, beside the app; each view opens its transaction, checks
who is asking with ``jobs.member`` (their CURRENT membership, scoped by row-level security) and
acts. A submit's wake-up goes out when the view's transaction commits.
"""

from __future__ import annotations

from uuid import UUID

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

from spacejobs import DomainError, connect

app = Flask(__name__)
jobs = connect()


def signed_in_user() -> UUID:
    # Your application's own authentication goes here; this example trusts a header.
    return UUID(request.headers["X-User-Id"])


@app.post("/orgs/<uuid:org>/reports")
def start_report(org: UUID) -> ResponseReturnValue:
    with jobs.engine.begin() as conn:
        job = jobs.submit(conn, "projects_report", organization_id=org,
                          requested_by=signed_in_user(),
                          request_id=request.headers.get("X-Request-ID")).job
    return jsonify({"job_id": str(job.id), "status": job.status}), 202


@app.get("/orgs/<uuid:org>/reports/<uuid:job_id>")
def report_status(org: UUID, job_id: UUID) -> ResponseReturnValue:
    with jobs.transaction(org, signed_in_user()) as (conn, member):
        job = jobs.get(conn, member, job_id)
        rights = jobs.rights(conn, member, job)
        body: dict[str, object] = {"status": job.status, "progress": job.progress}
        if job.status == "completed" and rights.may_read_result:
            _job, result, _stored = jobs.result(conn, member, job_id)
            body["result"] = result
    return jsonify(body)


#: how this application answers what the job API refuses (each error has a stable code, and a
#: message that is safe to show: no SQL, no value, no other tenant's data)
STATUS = {"not_found": 404, "insufficient_role": 403, "organization_unavailable": 409,
          "too_many_jobs": 429}


@app.errorhandler(DomainError)
def refused(error: DomainError) -> ResponseReturnValue:
    return jsonify({"error": error.code, "message": error.message}), STATUS.get(error.code, 400)
