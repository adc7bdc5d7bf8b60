"""No index of every organization's queued jobs by run_after: the claim cannot read it instead
of its own, and the due queue's ages are read from the claim's heads.

Revision ID: 0056
Revises: 0055

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0056"
down_revision = "0055"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
