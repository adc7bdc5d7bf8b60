"""One attempt's results (models/results/attempt.py): what stays inline, what goes to the store,
and that every file the attempt will not be recorded with is taken back."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from spacejobs.models.jobs.records import LeasedJob
from spacejobs.models.results.attempt import AttemptResults, NoResultStore, delete_quietly
from spacejobs.models.results.records import JSON, StoredResult
from spacejobs.models.results.store import LocalResultStore, belongs_to


def leased() -> LeasedJob:
    return LeasedJob(id=uuid.uuid4(), organization_id=uuid.uuid4(), requested_by=uuid.uuid4(),
                     kind="projects_export", params={}, attempt=1, max_attempts=3,
                     lease_token=uuid.uuid4(), lease_seconds=30, request_id=None)


@pytest.fixture
def store(tmp_path: Path) -> LocalResultStore:
    return LocalResultStore(tmp_path / "results")


def keys(store: LocalResultStore) -> set[str]:
    return {obj.key for obj in store.list()}


def test_a_result_at_the_threshold_stays_inline_and_one_byte_more_goes_to_the_store(store):
    value = {"n": "x" * 10}  # encoded: {"n": "xxxxxxxxxx"} = 19 bytes
    inline = AttemptResults(store, leased(), inline_max_bytes=19)
    assert inline.settle(value) == (value, None) and keys(store) == set()
    job = leased()
    stored = AttemptResults(store, job, inline_max_bytes=18)
    descriptor, ref = stored.settle(value)
    assert keys(store) == {ref} and belongs_to(ref, job.organization_id, job.id)
    assert descriptor == {"stored": {"content_type": "application/json", "size": 19, "form": JSON,
                                     "filename": f"projects_export-{job.id}.json"}}
    assert b"".join(store.open(ref).chunks()) == b'{"n": "xxxxxxxxxx"}'


def test_a_file_the_kind_returns_is_referenced_and_the_others_it_wrote_are_deleted(store):
    attempt = AttemptResults(store, leased())
    draft = attempt.put(b"draft", content_type="text/plain", filename="draft.txt")
    final = attempt.put(b"PK\x03\x04", content_type="application/zip", filename="out put.zip")
    assert final.filename == "out-put.zip" and final.size == 4
    descriptor, ref = attempt.settle(final)
    assert ref == final.key and descriptor == final.descriptor()
    assert keys(store) == {final.key} and draft.key not in keys(store)


def test_an_inline_result_takes_back_every_file_the_attempt_wrote(store):
    attempt = AttemptResults(store, leased())
    attempt.put(b"unused", content_type="text/plain", filename="a.txt")
    assert attempt.settle({"ok": True}) == ({"ok": True}, None)
    assert keys(store) == set() and attempt.written == []


def test_a_job_may_not_return_a_file_it_did_not_store_itself(store):
    other = AttemptResults(store, leased()).put(b"theirs", content_type="text/plain", filename="t")
    with pytest.raises(ValueError, match="only return a result it stored itself"):
        AttemptResults(store, leased()).settle(other)
    forged = StoredResult("org/job/forged", "text/plain", "x", 1)
    with pytest.raises(ValueError):
        AttemptResults(store, leased()).settle(forged)


def test_without_a_store_a_file_or_a_large_result_cannot_be_kept_but_a_small_one_can():
    attempt = AttemptResults(None, leased(), inline_max_bytes=10)
    with pytest.raises(NoResultStore):
        attempt.put(b"x", content_type="text/plain", filename="x")
    with pytest.raises(NoResultStore):
        attempt.settle("a long text result")
    assert AttemptResults(None, leased()).settle([1, 2]) == ([1, 2], None)


def test_discard_keeps_only_what_it_is_told_to(store):
    attempt = AttemptResults(store, leased())
    first = attempt.put(b"1", content_type="text/plain", filename="1")
    attempt.put(b"2", content_type="text/plain", filename="2")
    attempt.discard(keep=first.key)
    assert keys(store) == {first.key} and attempt.written == [first]
    attempt.discard()
    assert keys(store) == set()


class BrokenStore(LocalResultStore):
    def delete(self, key: str) -> None:
        raise OSError("disk on fire at /secret/path")


def test_a_delete_that_fails_is_left_to_the_orphan_sweep_and_logged_without_its_message(
        tmp_path, caplog):
    store = BrokenStore(tmp_path / "results")
    job = leased()
    with caplog.at_level(logging.WARNING, logger="spacejobs.results"):
        assert delete_quietly(store, "some/key", job.log_context) is False
    assert caplog.records[0].job_id == str(job.id)
    assert caplog.records[0].getMessage() == "could not delete a stored result; the orphan sweep will"
    assert delete_quietly(None, "some/key", {}) is False


def test_a_discard_goes_on_past_a_file_it_could_not_delete(tmp_path):
    store = BrokenStore(tmp_path / "results")
    attempt = AttemptResults(store, leased())
    attempt.put(b"1", content_type="text/plain", filename="1")
    attempt.put(b"2", content_type="text/plain", filename="2")
    attempt.discard()
    assert attempt.written == []  # both tried; the sweep takes what is left
