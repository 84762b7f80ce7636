"""candidates.best_speedup: the best passed bench speedup, kept up to date by
finish_stage, so the leaderboard reads the top rows of an index instead of aggregating
every bench evaluation. Existing databases are backfilled from their evaluations.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 15:00:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("best_speedup", sa.Float(), nullable=True))
        batch_op.create_index("ix_candidates_workload_best", ["workload_id", "best_speedup"], unique=False)
        batch_op.create_index("ix_candidates_best", ["best_speedup"], unique=False)
    op.execute(
        "UPDATE candidates SET best_speedup = ("
        " SELECT max(e.speedup) FROM evaluations AS e"
        " WHERE e.candidate_id = candidates.id AND e.stage = 'bench' AND e.status = 'passed')"
    )


def downgrade() -> None:
    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.drop_index("ix_candidates_best")
        batch_op.drop_index("ix_candidates_workload_best")
        batch_op.drop_column("best_speedup")
