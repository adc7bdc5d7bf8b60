"""Without the token, nothing: every change a worker makes to a job, and its steps, signals and
diagnostics, go through functions that take the lease token; taken signals name their sender.

Revision ID: 0039
Revises: 0038

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
