"""The organizations' audit log: an append-only table, written by the submit functions, the web's
cancel and download, and triggers on memberships and organizations; purged by age as the owner.

Revision ID: 0019
Revises: 0018

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    # The submit functions as 0005 made them (frozen, so reading that file is safe), before the
    # table they write goes.
    previous = (Path(__file__).parent / "0005_submit_functions.sql").read_text()
    for name in ("submit_job(", "submit_jobs("):
        start = previous.index("CREATE FUNCTION " + name)
        end = previous.index("END $$;", start) + len("END $$;")
        op.execute(previous[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute("DROP TRIGGER IF EXISTS organizations_audit ON organizations")
    op.execute("DROP TRIGGER IF EXISTS memberships_audit ON memberships")
    op.execute("DROP FUNCTION IF EXISTS organizations_audit()")
    op.execute("DROP FUNCTION IF EXISTS memberships_audit()")
    op.execute("DROP FUNCTION IF EXISTS purge_org_audit(interval, integer)")
    op.execute("DROP TABLE IF EXISTS org_audit")
    op.execute("DROP FUNCTION IF EXISTS app_actor()")
