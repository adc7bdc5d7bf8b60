"""The API principal: token, user and membership in one statement; the web no longer reads api_tokens.

Revision ID: 0008
Revises: 0007

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("GRANT SELECT ON api_tokens TO space_app")
    op.execute("DROP FUNCTION api_principal(bytea, uuid)")
