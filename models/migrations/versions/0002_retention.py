"""Retention: the bounded purge the sweeper calls, and the index it walks.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from models.db import read_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(read_sql("retention.sql"))


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS purge_finished_jobs(interval, interval, interval, integer)")
    op.execute("DROP INDEX IF EXISTS jobs_result_retention_idx")
