"""The index of a rate-limited kind's queued jobs can be read only by a statement that names a
kind: the fair claim's generic plan read it whole in place of its own.

Revision ID: 0057
Revises: 0056

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0057"
down_revision = "0056"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
