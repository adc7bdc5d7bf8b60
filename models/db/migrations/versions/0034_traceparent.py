"""A job row keeps the trace context of whatever submitted it (jobs.traceparent); children inherit it.

Revision ID: 0034
Revises: 0033

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: this revision replaced the submit functions")
