"""People: passwords (never readable by the web role) and revocable server-side web sessions.

Revision ID: 0007
Revises: 0006

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS check_login(text, text)")
    op.execute("DROP FUNCTION IF EXISTS login_challenge(text)")
    op.execute("DROP TABLE IF EXISTS web_sessions")
    op.execute("DROP TABLE IF EXISTS user_passwords")
