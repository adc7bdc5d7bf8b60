"""The records of a job's life (models/jobs/records.py) and the domain errors
(models/errors.py): the status sets, reading a row, and what an error carries."""

from __future__ import annotations

import uuid

import pytest

from spacejobs.models import errors
from spacejobs.models.jobs.records import ACTIVE, ALL_STATUSES, RUNNING, TERMINAL, Job, LeasedJob, Status
from tests.unit.test_people import job


def domain_errors() -> list[type[errors.DomainError]]:
    return [cls for cls in vars(errors).values() if isinstance(cls, type)
            and issubclass(cls, errors.DomainError) and cls is not errors.DomainError]


def test_every_status_is_active_or_terminal_never_both():
    assert set(ALL_STATUSES) == ACTIVE | TERMINAL and not ACTIVE & TERMINAL
    assert RUNNING < ACTIVE and Status.QUEUED not in RUNNING


@pytest.mark.parametrize("status", list(Status))
def test_a_job_is_finished_exactly_when_its_status_is_terminal(status):
    assert job(status=status).finished is status.terminal is (status in TERMINAL)


def test_a_row_is_read_into_a_job_with_its_status_typed_and_extra_columns_left_behind():
    shown = job(status=Status.LEASED)
    row = {field: getattr(shown, field) for field in Job.__dataclass_fields__}
    row |= {"status": "leased", "lease_token": uuid.uuid4(), "params": {"secret": 1}}
    read = Job.from_row(row)
    assert read == shown and read.status is Status.LEASED
    with pytest.raises(ValueError):
        Job.from_row(row | {"status": "exploded"})


def test_a_batchs_rows_read_by_position_make_the_same_jobs_as_by_name():
    made = job(status=Status.QUEUED, sequence_key="import-7")
    row = {**vars(made), "status": "queued", "outcome": "created", "member_role": None}
    del row["wait_until"], row["wait_signal"], row["wait_children"]  # a submit does not select them
    columns = list(row)
    read = Job.reader(columns)
    assert read(tuple(row.values())) == Job.from_row(row) == made
    assert type(read(tuple(row.values())).status) is Status
    with pytest.raises(KeyError):
        Job.reader([c for c in columns if c != "kind"])


def test_a_workers_log_context_names_the_attempt_never_params_or_the_lease():
    leased = LeasedJob(id=uuid.uuid4(), organization_id=uuid.uuid4(), requested_by=uuid.uuid4(),
                       kind="projects_export", params={"secret": "s3cr3t"}, attempt=2,
                       max_attempts=3, lease_token=uuid.uuid4(), lease_seconds=30, request_id="r-1")
    context = leased.log_context
    assert context == {"job_id": str(leased.id), "kind": "projects_export",
                       "organization_id": str(leased.organization_id), "attempt": 2,
                       "request_id": "r-1"}
    assert "s3cr3t" not in str(context) and str(leased.lease_token) not in str(context)


def test_statuses_are_the_strings_the_database_stores():
    assert [s.value for s in ALL_STATUSES] == ["queued", "leased", "cancel_requested", "waiting",
                                               "completed", "failed", "cancelled"]
    assert Status("cancel_requested") == "cancel_requested"


def test_error_codes_are_unique():
    codes = [cls.code for cls in domain_errors()]
    assert len(codes) == len(set(codes))


def test_every_error_has_its_own_sentence_ending_with_a_full_stop():
    for cls in domain_errors():
        assert cls.message != errors.DomainError.message, cls
        assert cls.message.endswith("."), cls


def test_an_error_carries_its_sentence_or_the_default_and_its_details():
    default = errors.NotFound()
    assert (default.message, str(default), default.details) == ("Not found.", "Not found.", {})
    told = errors.InvalidParams("Bad seconds.", fields=["seconds"])
    assert told.message == str(told) == "Bad seconds." and told.details == {"fields": ["seconds"]}
    assert errors.InvalidParams.message == "The job parameters are not valid."  # class untouched


def test_errors_are_permanent_except_an_internal_one_and_a_raiser_may_say_otherwise():
    assert errors.InvalidParams().permanent and errors.TimedOut().permanent
    assert not errors.InternalJobError().permanent
    assert not errors.TimedOut(permanent=False).permanent
    assert errors.InternalJobError(permanent=True).permanent
    assert errors.TimedOut.permanent  # the class's rule stays for the next one


def test_the_workers_stop_signals_are_not_domain_errors():
    for cls in (errors.LeaseLost, errors.CancelRequested, errors.ReleaseRequested):
        assert not issubclass(cls, errors.DomainError)
