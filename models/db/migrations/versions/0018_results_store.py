"""The results store: the finish records result_ref, retention returns the refs it dropped.

Revision ID: 0018
Revises: 0017

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("DROP FUNCTION results_without_files(text[], timestamptz)")
    op.execute("DROP FUNCTION result_files_in_use(text[], uuid[])")
    op.execute("DROP INDEX jobs_result_ref_idx")
    op.execute("REVOKE UPDATE (result_ref) ON jobs FROM space_worker")
    # purge_finished_jobs keeps its new answer: 0002's body would drop the refs unreported.
