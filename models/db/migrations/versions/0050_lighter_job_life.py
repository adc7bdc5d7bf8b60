"""A job's life writes less: jobs leaves room in each page for a job's later versions, job_events
and org_audit are keyed by the order they are read in (one index each, no key on id alone, no
BRIN), and the active counts are updated in place.

Revision ID: 0050
Revises: 0049

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0050"
down_revision = "0049"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
