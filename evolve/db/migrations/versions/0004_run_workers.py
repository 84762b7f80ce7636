"""run_workers: the processes working on a run, each with its own heartbeat (its lease),
and evaluations.worker_id, the process that holds a running evaluation. Several
`evolve run` processes, on any hosts sharing one database, can then work on one run:
a process whose heartbeat stops loses its running evaluations to the others, and the run
ends when its last process leaves. Rows from before have no worker (the run's own
heartbeat and pid still decide for them).

And candidates.claimed_at, when a candidate's first evaluation was claimed (NULL: it
waits for a run), with a partial index over the waiting ones: handing out waiting
candidates then reads those few rows instead of anti-joining every evaluation. Existing
candidates are backfilled from their first evaluation.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 10:30:00
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_workers_run_id_runs"),
        sa.PrimaryKeyConstraint("id", name="pk_run_workers"),
    )
    op.create_index("ix_run_workers_run_id", "run_workers", ["run_id"], unique=False)
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key("fk_evaluations_worker_id_run_workers", "run_workers", ["worker_id"], ["id"])
        batch_op.create_index("ix_evaluations_worker_id", ["worker_id"], unique=False)
    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("claimed_at", sa.DateTime(), nullable=True))
    op.execute(
        "UPDATE candidates SET claimed_at = ("
        " SELECT min(e.started_at) FROM evaluations AS e WHERE e.candidate_id = candidates.id)"
    )
    op.create_index("ix_candidates_waiting", "candidates", ["workload_id", "id"], unique=False,
                    sqlite_where=sa.text("claimed_at IS NULL"), postgresql_where=sa.text("claimed_at IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_candidates_waiting", table_name="candidates")
    with op.batch_alter_table("candidates", schema=None) as batch_op:
        batch_op.drop_column("claimed_at")
    with op.batch_alter_table("evaluations", schema=None) as batch_op:
        batch_op.drop_index("ix_evaluations_worker_id")
        batch_op.drop_constraint("fk_evaluations_worker_id_run_workers", type_="foreignkey")
        batch_op.drop_column("worker_id")
    op.drop_index("ix_run_workers_run_id", table_name="run_workers")
    op.drop_table("run_workers")
