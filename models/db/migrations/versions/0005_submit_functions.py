"""Submits as functions: one statement checks the standing and writes the job (single and bulk).

Revision ID: 0005
Revises: 0004

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION submit_jobs(uuid, uuid, text[], text, text, uuid[], text[], jsonb[],"
               " integer[], integer[], text[], timestamptz[])")
    op.execute("DROP FUNCTION submit_job(uuid, uuid, text, jsonb, integer, integer, text[], text,"
               " text, text, text, timestamptz, uuid)")
    op.execute("DROP FUNCTION role_rank(text)")
