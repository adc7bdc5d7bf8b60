"""The orphan sweep: keeps the results store and the job rows consistent, both ways.

- **Files no job needs** (older than the grace period) are deleted: a worker killed between
  writing a file and committing its finish, a stale finish whose clean-up failed, retention
  or an organization's deletion whose file deletes did not happen, a half-written local put.
  A file is kept while its job's row references it or while the job is running (the attempt
  that wrote it may still finish with it): see result_files_in_use() in the schema.
- **Rows whose file is missing** are reported (a warning with their job ids, and the count in
  the sweep's report); their result endpoint answers 410 ``result_missing``.

It lists the whole store each time, so beat runs it every ``SPACEJOBS_RESULTS_SWEEP_INTERVAL``
seconds (600), not with every sweep. Safe on several hosts at once: deletes are idempotent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from sqlalchemy import Engine

from spacejobs.models.db.queries import queries_beside
from spacejobs.models.db.transaction import transaction
from spacejobs.models.results.attempt import delete_quietly
from spacejobs.models.results.store import ResultStore, is_partial, job_of

Q = queries_beside(__file__)
log = logging.getLogger("spacejobs.results")


@dataclass
class OrphanReport:
    listed: int = 0
    #: files no job needed, older than the grace period, deleted
    deleted: int = 0
    #: files no job needs yet, still within the grace period
    young: int = 0
    #: objects whose names this code never makes (left alone)
    foreign: int = 0
    #: jobs whose row references a file the store does not have
    missing: list[UUID] = field(default_factory=list)


def sweep_orphans(engine: Engine, store: ResultStore, *, grace: float,
                  batch: int = 1000) -> OrphanReport:
    report = OrphanReport()
    with transaction(engine, actor="sweeper") as conn:
        listed_at = conn.execute(Q["database_now"]).scalar_one()
    objects = list(store.list())
    report.listed = len(objects)
    cutoff = datetime.now(UTC) - timedelta(seconds=grace)

    candidates: list[tuple[str, UUID]] = []
    doomed: list[str] = []
    for found in objects:
        job_id = job_of(found.key)
        if job_id is None and not is_partial(found.key):
            report.foreign += 1
        elif found.modified_at >= cutoff:
            report.young += 1
        elif job_id is None:
            doomed.append(found.key)  # a put that never finished
        else:
            candidates.append((found.key, job_id))
    for start in range(0, len(candidates), batch):
        chunk = candidates[start:start + batch]
        with transaction(engine, actor="sweeper") as conn:
            in_use = set(conn.execute(Q["files_in_use"], {
                "refs": [key for key, _ in chunk], "job_ids": [job for _, job in chunk]}).scalars())
        doomed.extend(key for key, _ in chunk if key not in in_use)
    for key in doomed:
        report.deleted += delete_quietly(store, key, {"job_id": str(job_of(key) or "-")})

    with transaction(engine, actor="sweeper") as conn:
        rows = conn.execute(Q["results_without_files"], {
            "present": [found.key for found in objects], "listed_at": listed_at}).all()
    report.missing = [row.job_id for row in rows]
    if rows:
        log.warning("%d completed job(s) reference a stored result the results store does not "
                    "have (their result endpoint answers 410 result_missing): %s", len(rows),
                    ", ".join(f"{row.kind} {row.job_id}" for row in rows[:20]))
    if report.foreign:
        log.warning("the results store holds %d object(s) this code did not write; left alone",
                    report.foreign)
    return report
