"""Initial schema: workloads, runs, candidates (+ parents), evaluations, promotions (+ confirmations).

Timestamps are naive UTC. The partial unique index uq_evaluations_claim is what makes
claiming a (candidate, stage) race-free across processes; stage 'confirm' may repeat.

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02 14:28:04.178958
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('workloads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workloads')),
    sa.UniqueConstraint('name', name=op.f('uq_workloads_name'))
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('strategy', sa.String(length=100), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(), nullable=False),
    sa.Column('ended_at', sa.DateTime(), nullable=True),
    sa.CheckConstraint("state IN ('running', 'finished', 'failed', 'interrupted')", name=op.f('ck_runs_state')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_runs_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_workload_id'), ['workload_id'], unique=False)

    op.create_table('candidates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('origin', sa.String(length=16), nullable=False),
    sa.Column('family', sa.String(length=200), nullable=True),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('digest', sa.String(length=128), nullable=False),
    sa.Column('directory', sa.Text(), nullable=False),
    sa.Column('generation', sa.Integer(), nullable=False),
    sa.Column('operator', sa.String(length=50), nullable=True),
    sa.Column('author', sa.String(length=200), nullable=True),
    sa.Column('notes', sa.Text(), nullable=True),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("origin IN ('template', 'agent', 'seed')", name=op.f('ck_candidates_origin')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_candidates_run_id_runs')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_candidates_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_candidates')),
    sa.UniqueConstraint('workload_id', 'digest', name=op.f('uq_candidates_workload_id_digest'))
    )
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_candidates_directory'), ['directory'], unique=False)
        batch_op.create_index(batch_op.f('ix_candidates_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_candidates_workload_id'), ['workload_id'], unique=False)

    op.create_table('candidate_parents',
    sa.Column('child_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['child_id'], ['candidates.id'], name=op.f('fk_candidate_parents_child_id_candidates'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['parent_id'], ['candidates.id'], name=op.f('fk_candidate_parents_parent_id_candidates')),
    sa.PrimaryKeyConstraint('child_id', 'position', name=op.f('pk_candidate_parents'))
    )
    with op.batch_alter_table('candidate_parents', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_candidate_parents_parent_id'), ['parent_id'], unique=False)

    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('candidate_id', sa.Integer(), nullable=False),
    sa.Column('stage', sa.String(length=32), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('retry_of', sa.Integer(), nullable=True),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('failure_kind', sa.String(length=32), nullable=True),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('server_instance', sa.String(length=255), nullable=True),
    sa.Column('gpu', sa.String(length=100), nullable=True),
    sa.Column('queue_ms', sa.Float(), nullable=True),
    sa.Column('lease_held_ms', sa.Float(), nullable=True),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('ended_at', sa.DateTime(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('ms', sa.Float(), nullable=True),
    sa.Column('baseline_ms', sa.Float(), nullable=True),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('spread', sa.Float(), nullable=True),
    sa.Column('excessive_sectors', sa.Integer(), nullable=True),
    sa.Column('registers', sa.Integer(), nullable=True),
    sa.Column('spills', sa.Integer(), nullable=True),
    sa.CheckConstraint("status IN ('running', 'passed', 'failed', 'interrupted')", name=op.f('ck_evaluations_status')),
    sa.ForeignKeyConstraint(['candidate_id'], ['candidates.id'], name=op.f('fk_evaluations_candidate_id_candidates')),
    sa.ForeignKeyConstraint(['retry_of'], ['evaluations.id'], name=op.f('fk_evaluations_retry_of_evaluations')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_evaluations_run_id_runs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_evaluations')),
    sa.UniqueConstraint('candidate_id', 'stage', 'attempt', name=op.f('uq_evaluations_candidate_id_stage_attempt'))
    )
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.create_index('ix_evaluations_leaderboard', ['stage', 'status', 'candidate_id', 'speedup'], unique=False)
        batch_op.create_index('ix_evaluations_status_run', ['status', 'run_id'], unique=False)
        batch_op.create_index('uq_evaluations_claim', ['candidate_id', 'stage'], unique=True, sqlite_where=sa.text("status IN ('running', 'passed') AND stage NOT IN ('confirm')"), postgresql_where=sa.text("status IN ('running', 'passed') AND stage NOT IN ('confirm')"))

    op.create_table('promotions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('candidate_id', sa.Integer(), nullable=False),
    sa.Column('previous_best_id', sa.Integer(), nullable=True),
    sa.Column('margin', sa.Float(), nullable=True),
    sa.Column('speedup_over_best', sa.Float(), nullable=True),
    sa.Column('promoted_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['candidate_id'], ['candidates.id'], name=op.f('fk_promotions_candidate_id_candidates')),
    sa.ForeignKeyConstraint(['previous_best_id'], ['candidates.id'], name=op.f('fk_promotions_previous_best_id_candidates')),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_promotions_workload_id_workloads')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_promotions'))
    )
    with op.batch_alter_table('promotions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_promotions_candidate_id'), ['candidate_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_promotions_workload_id'), ['workload_id'], unique=False)

    op.create_table('promotion_confirmations',
    sa.Column('promotion_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('evaluation_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], name=op.f('fk_promotion_confirmations_evaluation_id_evaluations')),
    sa.ForeignKeyConstraint(['promotion_id'], ['promotions.id'], name=op.f('fk_promotion_confirmations_promotion_id_promotions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('promotion_id', 'position', name=op.f('pk_promotion_confirmations'))
    )


def downgrade() -> None:
    op.drop_table('promotion_confirmations')
    with op.batch_alter_table('promotions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_promotions_workload_id'))
        batch_op.drop_index(batch_op.f('ix_promotions_candidate_id'))

    op.drop_table('promotions')
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_index('uq_evaluations_claim', sqlite_where=sa.text("status IN ('running', 'passed') AND stage NOT IN ('confirm')"), postgresql_where=sa.text("status IN ('running', 'passed') AND stage NOT IN ('confirm')"))
        batch_op.drop_index('ix_evaluations_status_run')
        batch_op.drop_index('ix_evaluations_leaderboard')

    op.drop_table('evaluations')
    with op.batch_alter_table('candidate_parents', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_candidate_parents_parent_id'))

    op.drop_table('candidate_parents')
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_candidates_workload_id'))
        batch_op.drop_index(batch_op.f('ix_candidates_run_id'))
        batch_op.drop_index(batch_op.f('ix_candidates_directory'))

    op.drop_table('candidates')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_workload_id'))

    op.drop_table('runs')
    op.drop_table('workloads')
