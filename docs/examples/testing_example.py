"""An application's tests of its kind and of the code that submits it (invoices.py), with
spacejobs.testing. The first three run in memory; the rest against PostgreSQL, in this process:
DATABASE_URL names a database `spacejobs db upgrade` migrated. No Celery worker, no Redis.

    DATABASE_URL=postgresql://... PYTHONPATH=docs/examples pytest docs/examples/testing_example.py
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from uuid import UUID

import invoices
import pytest

from spacejobs import InvalidParams, testing

INVOICE = {"invoice": "INV-7", "amount_cents": 1200}


@pytest.fixture(autouse=True)
def empty_outbox() -> None:
    invoices.OUTBOX.clear()


# -- in memory: the kind's own logic ----------------------------------------------------------

def test_a_paid_invoice_completes_without_a_reminder() -> None:
    result = testing.run_in_memory(invoices.invoice_reminder, INVOICE,
                                   signals={"paid": {"reference": "TX-1"}})
    assert result == {"invoice": "INV-7", "paid": True, "reference": "TX-1"}
    assert invoices.OUTBOX == []


def test_an_unpaid_invoice_is_reminded_once_its_grace_period_is_over() -> None:
    job = testing.MemoryJob(invoices.invoice_reminder, INVOICE | {"grace_days": 3})
    assert job.run() == "waiting"  # for the signal, holding no worker
    assert job.advance(days=2) == "waiting"  # not yet
    assert job.advance(days=1) == "queued"
    assert job.run() == "completed"
    assert job.result == {"invoice": "INV-7", "paid": False, "reminder": "reminder for INV-7"}
    assert invoices.OUTBOX == ["INV-7"]


def test_what_the_params_model_refuses_never_runs() -> None:
    with pytest.raises(InvalidParams):
        testing.run_in_memory(invoices.invoice_reminder, {"invoice": "7", "amount_cents": 0})


# -- against PostgreSQL: the submit, the signal and the engine ----------------------------------

@pytest.fixture(scope="module")
def harness() -> Iterator[testing.Harness]:
    with testing.Harness(os.environ["DATABASE_URL"]) as made:
        yield made


@pytest.fixture()
def member(harness: testing.Harness) -> testing.Member:
    return harness.member()  # of a new organization: each test's jobs are its own


def issue(harness: testing.Harness, member: testing.Member, invoice: str) -> UUID:
    with harness.jobs.engine.begin() as conn:
        return invoices.issue_invoice(harness.jobs, conn, organization_id=member.organization_id,
                                      user_id=member.user_id, invoice=invoice, amount_cents=500)


def test_issuing_an_invoice_submits_its_reminder_once(harness: testing.Harness,
                                                      member: testing.Member) -> None:
    issue(harness, member, "INV-8")
    job = harness.assert_submitted("invoice_reminder", params={"invoice": "INV-8"},
                                   organization_id=member.organization_id)
    assert job.status == "queued" and job.requested_by == member.user_id
    harness.refute_submitted("invoice_reminder", params={"invoice": "INV-9"})


def test_the_payment_webhook_completes_the_waiting_job(harness: testing.Harness,
                                                       member: testing.Member) -> None:
    job_id = issue(harness, member, "INV-10")
    ran = harness.run_job(job_id)
    assert (ran.outcome, ran.waits_for) == ("waiting", "signal")

    invoices.invoice_paid(harness.jobs, organization_id=member.organization_id,
                          user_id=member.user_id, job_id=job_id, reference="TX-10")
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert ran.result == {"invoice": "INV-10", "paid": True, "reference": "TX-10"}


def test_without_a_payment_the_reminder_goes_out_after_seven_days(harness: testing.Harness,
                                                                  member: testing.Member) -> None:
    job_id = issue(harness, member, "INV-11")
    assert harness.drain(organization_id=member.organization_id).outcomes() == [
        ("invoice_reminder", "waiting")]

    harness.advance(days=6, organization_id=member.organization_id)
    assert harness.drain(organization_id=member.organization_id) == []  # a day is left
    harness.advance(days=1, organization_id=member.organization_id)
    (ran,) = harness.drain(organization_id=member.organization_id)
    assert ran.job_id == job_id and ran.result["paid"] is False
    assert invoices.OUTBOX == ["INV-11"]
