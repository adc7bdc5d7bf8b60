"""The results store's interface, the same tests for each store: the local directory, and the
S3 store against a real S3-compatible server (moto's, in server mode, on localhost) through
boto3, as it would talk to a bucket."""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spacejobs.models.errors import ResultMissing, ResultNotStorable
from spacejobs.models.results.attempt import encode_result
from spacejobs.models.results.configured import open_store
from spacejobs.models.results.records import StoredResult, safe_filename
from spacejobs.models.results.s3 import S3ResultStore
from spacejobs.models.results.store import (
    KEY,
    LocalResultStore,
    ResultStore,
    belongs_to,
    is_partial,
    job_of,
    new_key,
)
from spacejobs.models.settings import Settings
from tests import s3server
from tests.s3server import new_bucket, s3_client


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with s3server.s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def results(request: pytest.FixtureRequest, tmp_path: Path) -> ResultStore:
    if request.param == "local":
        return LocalResultStore(tmp_path / "results")
    endpoint = request.getfixturevalue("s3_server")
    return S3ResultStore(s3_client(endpoint), new_bucket(endpoint), prefix="space/")


def a_key() -> str:
    return new_key(uuid.uuid4(), uuid.uuid4())


def read_all(store: ResultStore, key: str) -> bytes:
    return b"".join(store.open(key).chunks(7))


def test_put_then_open_gives_the_same_bytes_and_size(results: ResultStore):
    key, data = a_key(), os.urandom(200_000)
    assert results.put(key, data, content_type="application/octet-stream") == len(data)
    opened = results.open(key)
    assert opened.size == len(data)
    assert b"".join(opened.chunks()) == data


def test_a_stream_is_read_to_its_end_and_counted(results: ResultStore):
    key, data = a_key(), b"zip" * 100_000
    assert results.put(key, io.BytesIO(data), content_type="application/zip") == len(data)
    assert read_all(results, key) == data


def test_a_missing_object_is_result_missing(results: ResultStore):
    with pytest.raises(ResultMissing):
        results.open(a_key())


def test_delete_removes_and_is_idempotent(results: ResultStore):
    key = a_key()
    results.put(key, b"x", content_type="text/plain")
    results.delete(key)
    results.delete(key)
    with pytest.raises(ResultMissing):
        results.open(key)
    assert [found.key for found in results.list()] == []


def test_list_names_every_object_with_its_size_and_time(results: ResultStore):
    keys = {a_key(): b"a" * n for n in (1, 10, 100)}
    for key, data in keys.items():
        results.put(key, data, content_type="text/plain")
    listed = {found.key: found for found in results.list()}
    assert set(listed) == set(keys)
    for key, data in keys.items():
        assert listed[key].size == len(data)
        assert listed[key].modified_at.tzinfo is not None


def test_two_attempts_of_one_job_get_different_keys_and_keep_both(results: ResultStore):
    org, job = uuid.uuid4(), uuid.uuid4()
    first, second = new_key(org, job), new_key(org, job)
    assert first != second
    results.put(first, b"1", content_type="text/plain")
    results.put(second, b"2", content_type="text/plain")
    results.delete(first)
    assert read_all(results, second) == b"2"


def test_s3_objects_carry_their_content_type(s3_server: str):
    client, bucket = s3_client(s3_server), new_bucket(s3_server)
    store = S3ResultStore(client, bucket)
    key = a_key()
    store.put(key, b"PK", content_type="application/zip")
    assert store.open(key).content_type == "application/zip"
    assert client.head_object(Bucket=bucket, Key=key)["ContentType"] == "application/zip"


def test_s3_store_is_chosen_by_the_settings(s3_server: str, monkeypatch: pytest.MonkeyPatch):
    for name, value in s3server.CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    settings = Settings(results_store="s3", s3_bucket=new_bucket(s3_server),
                        s3_endpoint_url=s3_server, s3_region=s3server.REGION)
    store = open_store(settings)
    assert isinstance(store, S3ResultStore)
    key = a_key()
    store.put(key, b"through the settings", content_type="text/plain")
    assert read_all(store, key) == b"through the settings"
    with pytest.raises(ValueError, match="S3_BUCKET"):
        open_store(Settings(results_store="s3"))


def test_keys_hold_the_organization_the_job_and_128_random_bits():
    org, job = uuid.uuid4(), uuid.uuid4()
    key = new_key(org, job)
    assert KEY.match(key) and job_of(key) == job
    assert belongs_to(key, org, job)
    assert not belongs_to(key, uuid.uuid4(), job) and not belongs_to(key, org, uuid.uuid4())
    assert len({new_key(org, job) for _ in range(1000)}) == 1000
    assert job_of("../etc/passwd") is None and job_of(f"{org}/{job}") is None


def test_the_local_store_refuses_paths_that_leave_it(tmp_path: Path):
    store = LocalResultStore(tmp_path / "results")
    for bad in ("../outside", "a/../../outside", "/etc/passwd", "a//b", "", "a/./b"):
        with pytest.raises(ValueError):
            store.open(bad)
        with pytest.raises(ValueError):
            store.put(bad, b"x", content_type="text/plain")
    assert not (tmp_path / "outside").exists()


def test_a_local_put_is_all_or_nothing_and_a_crash_leaves_only_a_partial(tmp_path: Path):
    store = LocalResultStore(tmp_path / "results")
    key = a_key()

    class Broken(io.RawIOBase):
        def readinto(self, buffer: Any) -> int:
            raise OSError("disk went away")

    with pytest.raises(OSError):
        store.put(key, Broken(), content_type="text/plain")  # type: ignore[arg-type]
    with pytest.raises(ResultMissing):
        store.open(key)
    assert list(store.list()) == []  # the temporary file was removed
    # A process killed mid-put cannot remove it: it is listed, and known for a leftover.
    leftover = store.root / key.rsplit("/", 1)[0] / f".{key.rsplit('/', 1)[1]}.abc123_x.part"
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_bytes(b"half")
    [listed] = store.list()
    assert is_partial(listed.key) and job_of(listed.key) is None


def test_deleting_the_last_file_of_a_job_removes_its_folders(tmp_path: Path):
    store = LocalResultStore(tmp_path / "results")
    key = a_key()
    store.put(key, b"x", content_type="text/plain")
    store.delete(key)
    assert list(store.root.iterdir()) == []


def test_a_stored_result_is_described_in_the_row_and_read_back():
    stored = StoredResult(a_key(), "application/zip", "projects.zip", 12, "file")
    assert StoredResult.from_row(stored.key, stored.descriptor()) == stored
    assert safe_filename('a "quoted"\r\nname/../x.zip') == "a-quoted-name-..-x.zip"
    assert safe_filename("...") == "result"


@pytest.mark.parametrize("value", [{"a": "x\x00"}, {"k\x00": 1}, ["\\\x00"], float("nan"),
                                   {"n": float("inf")}, [float("-inf")]])
def test_a_result_jsonb_cannot_hold_is_refused_before_the_finish(value: Any):
    with pytest.raises(ResultNotStorable):
        encode_result(value)


@pytest.mark.parametrize("value, stored", [
    ({"a": "\\u0000"}, b'{"a": "\\\\u0000"}'),  # the text \u0000, not a NUL
    ({"n": 1e308, "s": "caf\u00e9"}, b'{"n": 1e+308, "s": "caf\\u00e9"}'),
])
def test_every_other_json_value_is_kept_as_it_was(value: Any, stored: bytes):
    assert encode_result(value) == stored
