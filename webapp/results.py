"""Serving a stored result: streamed from the results store, never read whole into memory.

Both the JSON API and the people's download come here, after
:meth:`models.jobs.service.Jobs.result` checked the CURRENT membership and the kind's
role, and with the transaction already closed (a slow download holds no connection). The file
is the one the job's own row names; a client never names one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from flask import Response, current_app

from spacejobs.models.errors import ResultMissing
from spacejobs.models.jobs.records import Job
from spacejobs.models.results.records import JSON, StoredResult, safe_filename
from spacejobs.models.results.store import ResultStore, StoredFile, belongs_to

log = logging.getLogger("spacejobs.web")


def result_store() -> ResultStore:
    store: ResultStore = current_app.extensions["spacejobs.results"]
    return store


def stored_result_response(job: Job, stored: StoredResult, *, envelope: bool) -> Response:
    """The file, with its own Content-Type, as an attachment named by the job; with
    ``envelope`` (the API), a JSON result kept in the store because of its size comes in the
    same ``{"job_id", "kind", "result"}`` body as an inline one."""
    if not belongs_to(stored.key, job.organization_id, job.id):
        # The finish writes keys made for the job's own organization and id: anything else in
        # the row is not ours to serve.
        log.error("a job row names a stored result of another job; refusing it",
                  extra={"job_id": str(job.id)})
        raise ResultMissing()
    opened = result_store().open(stored.key)  # ResultMissing: 410 result_missing
    headers = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    if envelope and stored.form == JSON:
        head = json.dumps({"job_id": str(job.id), "kind": job.kind})[:-1].encode() + b', "result": '
        headers["Content-Length"] = str(len(head) + opened.size + 1)
        return Response(_enveloped(head, opened), mimetype="application/json", headers=headers)
    headers["Content-Length"] = str(opened.size)
    headers["Content-Disposition"] = f'attachment; filename="{safe_filename(stored.filename)}"'
    return Response(opened.chunks(), content_type=stored.content_type, headers=headers)


def _enveloped(head: bytes, opened: StoredFile) -> Iterator[bytes]:
    yield head
    yield from opened.chunks()  # closing this generator closes the file too
    yield b"}"
