"""The jobs' update trigger counts its metrics per kind and bucket before it makes their rows,
and counts as active only the jobs whose activeness changed: a drain's claims and finishes no
longer build a bucket's CASE anew for every job, nor sum a claim's counts to nothing.

Revision ID: 0059
Revises: 0058

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0059"
down_revision = "0058"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
