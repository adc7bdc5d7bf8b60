"""An application's kind and the code that starts and signals it: the application under test in
the testing guide (docs/guides/testing.md), whose tests are testing_example.py beside it.

An invoice is issued with a reminder job. The job waits, without a worker, for the payment
provider's webhook (the signal ``paid``); once the grace period passes without it, it sends one
reminder.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from pydantic import Field
from sqlalchemy import Connection

from spacejobs import JobContext, Jobs, Params, SignalTimeout, Status, job_kind

#: the reminders this application sent (a real one calls its mail service here)
OUTBOX: list[str] = []


class ReminderParams(Params):
    invoice: Annotated[str, Field(pattern=r"^INV-[0-9]{1,10}$")]
    amount_cents: Annotated[int, Field(ge=1)]
    grace_days: Annotated[float, Field(gt=0, le=60)] = 7


def send_reminder(params: ReminderParams) -> str:
    OUTBOX.append(params.invoice)
    return f"reminder for {params.invoice}"


@job_kind("invoice_reminder", org_states={"active"}, max_attempts=3)
def invoice_reminder(ctx: JobContext, params: ReminderParams) -> dict[str, Any]:
    try:
        payment = ctx.wait_for_signal("paid", timeout=params.grace_days * 86400)
    except SignalTimeout:
        # A step: sent once for the job, whatever runs follow.
        sent = ctx.step("remind", lambda: send_reminder(params))
        return {"invoice": params.invoice, "paid": False, "reminder": sent}
    return {"invoice": params.invoice, "paid": True, "reference": payment["reference"]}


def issue_invoice(jobs: Jobs, conn: Connection, *, organization_id: UUID, user_id: UUID,
                  invoice: str, amount_cents: int) -> UUID:
    """What the view that issues an invoice does, in its own transaction: its own rows, and the
    reminder (one per invoice: its dedup key)."""
    submitted = jobs.submit(conn, "invoice_reminder",
                            {"invoice": invoice, "amount_cents": amount_cents},
                            organization_id=organization_id, requested_by=user_id,
                            dedup_key=invoice)
    return submitted.job.id


def invoice_paid(jobs: Jobs, *, organization_id: UUID, user_id: UUID, job_id: UUID,
                 reference: str) -> Status | None:
    """The payment provider's webhook: tell the invoice's reminder it was paid."""
    with jobs.transaction(organization_id, user_id) as (conn, member):
        return jobs.signal(conn, member, job_id, "paid", {"reference": reference})
