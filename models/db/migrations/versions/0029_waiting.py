"""Jobs that wait without holding a worker: status waiting, job_steps, job_signals.

Revision ID: 0029
Revises: 0028

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: waiting jobs, their steps and their signals "
                              "have no place in 0028's schema")
