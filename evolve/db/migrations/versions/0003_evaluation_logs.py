"""evaluation_logs: each stage attempt's full stdout, stderr and exception traceback,
bounded and zlib-compressed, one row per evaluation that produced any. And stage
'rebench' (`evolve evaluate --rebench N`) may repeat, like 'confirm': the claim index
leaves it out.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 07:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


_CLAIM_OLD = "status IN ('running', 'passed') AND stage NOT IN ('confirm')"
_CLAIM_NEW = "status IN ('running', 'passed') AND stage NOT IN ('confirm', 'rebench')"


def _claim_index(where: str) -> None:
    op.drop_index("uq_evaluations_claim", table_name="evaluations")
    op.create_index("uq_evaluations_claim", "evaluations", ["candidate_id", "stage"], unique=True,
                    sqlite_where=sa.text(where), postgresql_where=sa.text(where))


def upgrade() -> None:
    _claim_index(_CLAIM_NEW)
    op.create_table(
        "evaluation_logs",
        sa.Column("evaluation_id", sa.Integer(), nullable=False),
        sa.Column("stdout", sa.LargeBinary(), nullable=True),
        sa.Column("stderr", sa.LargeBinary(), nullable=True),
        sa.Column("traceback", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(["evaluation_id"], ["evaluations.id"],
                                name="fk_evaluation_logs_evaluation_id_evaluations", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("evaluation_id", name="pk_evaluation_logs"),
    )


def downgrade() -> None:
    op.execute("DELETE FROM evaluations WHERE stage = 'rebench'")  # the old index can't hold repeats
    _claim_index(_CLAIM_OLD)
    op.drop_table("evaluation_logs")
