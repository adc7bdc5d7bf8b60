"""The orphan-sweep chore (tasks/maintenance/result_orphans.py) against PostgreSQL and a local
results store: a file no job row references, older than the grace, is deleted; a referenced one
and a young one stay. (Every case of the sweep itself is tests/integration/test_results_store.py's.)"""

from __future__ import annotations

import os
import time
import uuid

from spacejobs.models.results.store import new_key
from spacejobs.tasks.maintenance.result_orphans import ResultOrphans, ResultOrphansReport
from tests.integration.maintenance_kit import as_beat, drain_queue, new_job
from tests.kit.stack import Stack


def aged(stack: Stack, key: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(stack.results()._path(key), (then, then))


def test_an_old_orphan_goes_and_the_rest_stays(bare_stack: Stack):
    stack = bare_stack
    store = stack.results()
    org = stack.org()
    drain_queue(stack)
    finished = new_job(stack, org=org)
    drain_queue(stack)  # completed, with no stored result: its files are orphans
    old_orphan = new_key(org, finished.id)
    young_orphan = new_key(org, uuid.uuid4())
    for key in (old_orphan, young_orphan):
        store.put(key, b"x", content_type="text/plain")
    aged(stack, old_orphan, 7200)

    report = ResultOrphans(600).run(as_beat(stack, results_orphan_grace=3600))

    assert report == ResultOrphansReport(listed=2, deleted=1, young=1)
    assert {found.key for found in store.list()} == {young_orphan}
