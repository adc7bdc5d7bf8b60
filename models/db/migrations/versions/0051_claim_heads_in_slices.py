"""The claim heads' chore visits a slice of the organizations a run, going on round the ring
where the last run stopped: its lock, which submits wait for, is held for a slice of the heads.

Revision ID: 0051
Revises: 0050

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0051"
down_revision = "0050"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
