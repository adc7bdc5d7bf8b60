"""The leases a worker hands back (a heartbeat, a finish, a release, the requester's standing)
are joined to their rows by hash or one key probe each, not every row against every lease.

Revision ID: 0063
Revises: 0062

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0063"
down_revision = "0062"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    raise NotImplementedError("restore a backup: the SQL bodies are not rebuilt")
