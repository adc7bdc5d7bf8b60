"""The public face: ``import spacejobs`` gives what an application uses, and nothing else is
promised. The names are pinned here: adding or removing one is a change of the public API (say
so in docs/changelog.md)."""

from __future__ import annotations

import subprocess
import sys

import spacejobs

PUBLIC = [
    "AlreadyResumed", "ChildrenFailed", "Delivered", "DomainError", "DuplicateJob", "IdempotencyKeyReused",
    "InsufficientRole", "InvalidParams", "InvalidRequest", "Job", "JobContext", "JobFinished",
    "JobNotCompleted", "JobRequest", "JobRights", "Jobs", "Membership", "MissingGrant", "NoParams",
    "NoStepWaits", "NotFound", "NotResumable",
    "OrganizationReadOnly", "OrganizationUnavailable", "Outcome", "Params", "RequesterNotMember",
    "ResultExpired", "Signal", "SignalTimeout", "SpaceJobs", "Status", "StepsFailed",
    "Submitted", "Tenancy", "Tenant", "TimedOut", "TooManyJobs", "TooManySignals",
    "UnknownKind", "chain", "chord", "connect", "graph", "group", "job_kind", "sig",
]


def test_the_public_names_are_pinned():
    assert spacejobs.__all__ == PUBLIC


def test_every_public_name_resolves_to_what_its_module_defines():
    for name in PUBLIC:
        value = getattr(spacejobs, name)
        assert getattr(value, "__name__", name) == name, name


def test_an_unknown_name_is_an_attribute_error():
    try:
        spacejobs.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("no AttributeError")


def test_importing_the_face_imports_neither_flask_nor_the_worker_engine():
    """A worker imports what it uses; the face costs nothing until a name is asked for."""
    code = ("import sys, spacejobs; "
            "print(sorted(m for m in ('flask', 'celery', 'spacejobs.tasks.engine.runner') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_domain_errors_carry_a_code_a_message_and_their_permanence():
    error = spacejobs.DomainError("The image is larger than 20 MB.", permanent=True)
    assert (error.code, error.message, error.permanent) == ("error", "The image is larger than 20 MB.",
                                                            True)

    class ImageTooLarge(spacejobs.DomainError):
        code = "image_too_large"
        message = "The image is too large."
        permanent = True

    assert (ImageTooLarge().code, ImageTooLarge().message) == ("image_too_large",
                                                              "The image is too large.")
    assert ImageTooLarge(permanent=False, limit=20).details == {"limit": 20}


def test_a_job_read_from_python_has_the_jsons_fields_under_the_same_names():
    """``spacejobs.Job`` and the HTTP API's job JSON say the same things by the same names."""
    import uuid
    from datetime import UTC, datetime

    from spacejobs.webapp.api import job_json
    from tests.unit.offline_app import offline_app

    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    job = spacejobs.Job(
        id=uuid.uuid4(), organization_id=uuid.uuid4(), requested_by=uuid.uuid4(), kind="k",
        status=spacejobs.Status.WAITING, attempts=1, max_attempts=3, progress={"stage": "x"},
        error_code="boom", error_message="It broke.", dedup_key=None, run_after=now,
        created_at=now, updated_at=now, started_at=now, finished_at=None,
        cancel_requested_at=None, leased_by=None, lease_until=None, result_expired_at=None,
        wait_until=now, wait_signal="approve", wait_children=None, sequence_key="s")
    with offline_app().test_request_context("/"):
        document = job_json(job)
    for name, value in document.items():
        if name == "links":
            continue
        if name == "waiting_reason":
            # Not on the row: the flow control that holds a queued job back is read beside it,
            # in Python as in the web, by Jobs.why_waiting (a waiting job's from its own row).
            assert value["reason"] == "signal" and value["signal"] == "approve", value
            assert callable(spacejobs.Jobs.why_waiting)
            continue
        mine = getattr(job, name)
        if isinstance(mine, tuple):  # error, waiting_for
            mine = mine._asdict()
        as_json = {k: (v.isoformat() if isinstance(v, datetime) else v)
                   for k, v in mine.items()} if isinstance(mine, dict) else mine
        if isinstance(as_json, datetime):
            as_json = as_json.isoformat()
        elif isinstance(as_json, uuid.UUID):
            as_json = str(as_json)
        assert as_json == value, name


def test_the_written_out_names_are_those_the_face_imports():
    assert sorted(spacejobs._WHERE) == spacejobs.__all__
