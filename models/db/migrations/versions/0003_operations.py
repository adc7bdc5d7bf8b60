"""Operations: worker presence, kind controls, operator audit, retry lineage, metric counters.

Revision ID: 0003
Revises: 0002

Frozen: this revision runs the ``.sql`` file of the same name beside it, never edited again.
"""

from pathlib import Path

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(Path(__file__).with_suffix(".sql").read_text())


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_count_metrics ON jobs")
    for function in ("jobs_count_metrics()", "count_event(text, text, double precision)",
                     "metric_bucket(double precision)", "metric_buckets()",
                     "bump_metric(text, text, text, double precision)"):
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    for table in ("metric_counters", "metric_events", "operator_audit", "kind_settings",
                  "worker_processes"):
        op.execute(f"DROP TABLE IF EXISTS {table}")
    op.execute("ALTER TABLE jobs DROP COLUMN IF EXISTS retry_of")
