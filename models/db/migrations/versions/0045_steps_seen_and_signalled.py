"""Clients see and steer a workflow's steps: the places and kinds of a parent's children not
made yet (job_unmade_steps()), and a signal to a workflow handed to the step that waits for it
(signal_job() answers which job holds it).

Revision ID: 0045
Revises: 0044

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0045"
down_revision = "0044"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
