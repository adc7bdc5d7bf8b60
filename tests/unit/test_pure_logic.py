"""Pure logic: no database, no broker."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from spacejobs.models import errors
from spacejobs.models.db.migrate import schema_files
from spacejobs.models.db.roles import listen_url, role_url
from spacejobs.models.errors import InvalidParams, UnknownKind
from spacejobs.models.jobs import store
from spacejobs.models.jobs.records import Job
from spacejobs.models.kinds import KindRules, NoParams, get_any_kind, get_kind, load_kinds
from spacejobs.models.settings import reload_settings
from spacejobs.webapp.errors import HTTP_STATUS

load_kinds()


def rules(**kw) -> KindRules:
    base = dict(name="x", org_states=frozenset({"active"}), role="member", max_attempts=5,
                backoff_base=1.0, backoff_max=10.0, lease=timedelta(seconds=30), time_limit=None,
                hard_time_limit=None, retry_on_timeout=False,
                dedupable=True, params=NoParams)
    return KindRules(**(base | kw))


def test_backoff_doubles_within_jitter_bounds_and_is_capped():
    r = rules()
    for attempt, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (9, 10)]:
        delays = [r.backoff(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > 0  # jittered, so retries spread out


def test_every_domain_error_code_has_one_http_status():
    codes = {cls.code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.DomainError)
             and cls is not errors.DomainError}
    worker_only = {"requester_not_member", "timed_out", "internal_error", "result_not_storable",
                   "signal_timeout"}
    assert codes - worker_only <= set(HTTP_STATUS)


def test_a_lost_result_file_is_gone_but_says_so_apart_from_an_expired_one():
    assert HTTP_STATUS["result_missing"] == HTTP_STATUS["result_expired"] == 410
    assert errors.ResultMissing.message != errors.ResultExpired.message
    assert "new job" in errors.ResultMissing.message


def test_job_view_has_no_lease_token_field():
    assert "lease_token" not in {f.name for f in dataclasses.fields(Job)}


def test_params_reject_unknown_fields_and_out_of_range_values():
    sleep = get_kind("bench.sleep")
    assert sleep.parse_params({"seconds": 2}).seconds == 2
    with pytest.raises(InvalidParams) as too_long:
        sleep.parse_params({"seconds": 61})
    assert too_long.value.details["fields"] == ["seconds"]
    with pytest.raises(InvalidParams):
        sleep.parse_params({"seconds": 1, "organization_id": "x"})
    with pytest.raises(InvalidParams):
        get_kind("projects_import").parse_params({"projects": []})
    with pytest.raises(InvalidParams):
        sleep.parse_params(["not", "an", "object"])


@pytest.mark.parametrize("project_id", ["MEMBER-TEXT-" + "x" * 24, "", 42, None])
def test_a_project_report_part_takes_a_uuid_and_names_the_field_otherwise(project_id):
    part = get_any_kind("projects_report.project")
    with pytest.raises(InvalidParams) as refused:
        part.parse_params({"project_id": project_id})
    assert refused.value.details["fields"] == ["project_id"]
    assert part.parse_params({"project_id": "6D0C3E5E-3A4B-4C5D-8E9F-0A1B2C3D4E5F"}
                             ).model_dump(mode="json") == {
        "project_id": "6d0c3e5e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"}


@pytest.mark.parametrize("name", ["nope", "", None, 3, "projects_export "])
def test_unknown_kinds_are_refused(name):
    with pytest.raises(UnknownKind):
        get_kind(name)


def test_named_queries_are_all_loaded():
    queries = {name: clause.text for name, clause in store.Q.items()}
    for name in ("submit", "claim_batch", "extend_leases", "complete_batch", "lease_standing",
                 "fail_attempt", "release_batch", "request_cancel", "sweep_expired_leases",
                 "sweep_unsignalled", "lock_lease"):
        assert queries[name].strip(), name
    assert "claim_jobs(" in queries["claim_batch"]
    schema = "".join(path.read_text() for path in schema_files())
    claim = schema[schema.index("CREATE FUNCTION claim_jobs("):]
    claim = claim[:claim.index("END $$;")]
    code = "\n".join(line for line in claim.splitlines() if not line.strip().startswith("--"))
    # the organizations' shares, and for a rate-limited pair: its window row (twice: found, or
    # made and then locked) and its jobs (expired leases are the sweeper's)
    assert code.count("SKIP LOCKED") == 4
    assert "FOR UPDATE OF q SKIP LOCKED" in code and "FOR UPDATE SKIP LOCKED" in code
    assert "gen_random_uuid()" in claim  # a fresh token for every row
    complete = schema[schema.index("CREATE FUNCTION complete_jobs("):]
    assert "j.lease_token = d.token" in complete[:complete.index("END $$;")]  # fenced per row


def test_role_urls_swap_the_user_and_keep_the_server(monkeypatch):
    monkeypatch.delenv("SPACEJOBS_DB_ROLE_PASSWORD", raising=False)
    reload_settings()
    base = "postgresql://postgres:secret@db.example:5433/space?sslmode=require"
    url = role_url("space_worker", base)
    assert url == "postgresql+psycopg://space_worker@db.example:5433/space?sslmode=require"
    monkeypatch.setenv("SPACEJOBS_DB_ROLE_PASSWORD", "pw")
    reload_settings()
    assert role_url("space_app", base).startswith("postgresql+psycopg://space_app:pw@db.example:5433/")
    # A role's own password wins, so a service can be given only its own role's secret.
    monkeypatch.setenv("SPACEJOBS_WORKER_DB_PASSWORD", "worker-only")
    reload_settings()
    assert role_url("space_worker", base).startswith("postgresql+psycopg://space_worker:worker-only@")
    assert role_url("space_app", base).startswith("postgresql+psycopg://space_app:pw@")
    monkeypatch.undo()
    reload_settings()


def test_listen_url_is_direct_and_never_through_a_transaction_pooler(monkeypatch):
    pooled = "postgresql+psycopg://space_worker:pw@pgbouncer.internal:6432/space"
    for name in ("SPACEJOBS_DB_POOLER", "SPACEJOBS_LISTEN_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    reload_settings()
    assert listen_url(pooled) == "postgresql://space_worker:pw@pgbouncer.internal:6432/space"
    # Through the pooler a LISTEN hears nothing and stays behind on a shared server connection.
    monkeypatch.setenv("SPACEJOBS_DB_POOLER", "transaction")
    reload_settings()
    assert listen_url(pooled) is None
    # A direct server: its address and database, the process's own role and password.
    monkeypatch.setenv("SPACEJOBS_LISTEN_DATABASE_URL",
                       "postgresql://ignored:other@db.internal:5432/space?sslmode=require")
    reload_settings()
    assert (listen_url(pooled)
            == "postgresql://space_worker:pw@db.internal:5432/space?sslmode=require")
    monkeypatch.undo()
    reload_settings()
