"""Fan-outs and workflows the database runs: each child's end makes the next, the parent runs twice.

Revision ID: 0033
Revises: 0032

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the workers of this revision start fan-outs "
                              "that only its trigger carries on")
