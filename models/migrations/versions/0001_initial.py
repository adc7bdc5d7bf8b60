"""Initial schema: tenants, users, tokens, projects, jobs, events, diagnostics, RLS.

Revision ID: 0001
Revises:
"""

from alembic import op

from models.db import read_sql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(read_sql("schema.sql"))
    op.execute(read_sql("security.sql"))


def downgrade() -> None:
    for table in ("job_diagnostics", "job_events", "jobs", "projects", "memberships",
                  "api_tokens", "users", "organizations"):
        op.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    op.execute("DROP FUNCTION IF EXISTS jobs_check_transition, jobs_record_event, app_org, app_user")
