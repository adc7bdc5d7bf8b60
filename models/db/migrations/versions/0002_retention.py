"""Retention: the bounded purge the sweeper calls, and the index it walks.

Revision ID: 0002
Revises: 0001

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS purge_finished_jobs(interval, interval, interval, integer)")
    op.execute("DROP INDEX IF EXISTS jobs_result_retention_idx")
