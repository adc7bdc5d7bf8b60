"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}

Frozen once merged: this revision runs the ``.sql`` file of the same name beside it, which is
never edited again (README, "Changing the schema").
"""

from pathlib import Path

from alembic import op

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
