"""Initial schema: tenants, users, tokens, projects, jobs, events, diagnostics, RLS and grants.

Revision ID: 0001
Revises:

Frozen: this revision runs ``0001_initial.sql`` beside it, which is never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    for table in ("job_diagnostics", "job_events", "jobs", "projects", "memberships",
                  "api_tokens", "users", "organizations"):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    op.execute("DROP FUNCTION IF EXISTS jobs_check_transition, jobs_record_event, app_org, app_user")
