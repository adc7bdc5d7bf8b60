"""Resume and failure handling: a failed or cancelled workflow resumed as a new workflow that
reuses the steps the old run completed (resume_workflow(), job_workflow_reused), and a
workflow's failure handler made once when it fails (start_failure_handler(),
job_failure_handlers).

Revision ID: 0047
Revises: 0046

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0047"
down_revision = "0046"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
