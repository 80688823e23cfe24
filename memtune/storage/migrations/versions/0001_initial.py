"""Initial schema: GPU types, models, profiles, jobs, job claims, results, API keys.

Revision ID: 0001
Revises:
Create Date: 2026-11-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from memtune.storage.orm import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mt_gpu_types",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("compute_capability", sa.String(16), nullable=True),
        sa.Column("sm_count", sa.Integer(), nullable=True),
        sa.Column("memory_bytes", sa.BigInteger(), nullable=False),
        sa.Column("pcie_gen", sa.Integer(), nullable=True),
        sa.Column("pcie_width", sa.Integer(), nullable=True),
        sa.Column("driver", sa.String(64), nullable=True),
        sa.Column("cudnn_version", sa.String(64), nullable=True),
        sa.Column("identity_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "mt_models",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("n_stages", sa.Integer(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_mt_models_name", "mt_models", ["name"])
    op.create_table(
        "mt_profiles",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "model_id",
            sa.String(32),
            sa.ForeignKey("mt_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "gpu_key",
            sa.String(64),
            sa.ForeignKey("mt_gpu_types.key", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("profile_json", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint(
            "model_id",
            "gpu_key",
            "batch",
            "dtype",
            "source",
            name="uq_mt_profiles_lookup",
        ),
    )
    op.create_table(
        "mt_jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "model_id",
            sa.String(32),
            sa.ForeignKey("mt_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("gpu_key", sa.String(64), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("budget_text", sa.String(64), nullable=False),
        sa.Column("budget_bytes", sa.BigInteger(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("optimizer", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("best_name", sa.String(100), nullable=True),
        sa.Column("best_step_ms", sa.Float(), nullable=True),
        sa.Column("best_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("unconstrained_step_ms", sa.Float(), nullable=True),
        sa.Column("unconstrained_peak_bytes", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("owner", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(200), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("study_name", sa.String(100), nullable=False),
        sa.Column(
            "profile_id",
            sa.Integer(),
            sa.ForeignKey("mt_profiles.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("worker_id", sa.String(100), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("owner", "idempotency_key", name="uq_mt_jobs_idempotency"),
    )
    op.create_index("ix_mt_jobs_claim", "mt_jobs", ["state", "gpu_key", "created_at"])
    op.create_table(
        "mt_job_claims",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id",
            sa.String(32),
            sa.ForeignKey("mt_jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("worker_id", sa.String(100), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("reclaimed_from", sa.String(100), nullable=True),
        sa.Column("claimed_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("job_id", "attempt", name="uq_mt_job_claims_attempt"),
    )
    op.create_index("ix_mt_job_claims_job_id", "mt_job_claims", ["job_id"])
    op.create_table(
        "mt_results",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "job_id",
            sa.String(32),
            sa.ForeignKey("mt_jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "model_id",
            sa.String(32),
            sa.ForeignKey("mt_models.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("gpu_key", sa.String(64), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("budget_bytes", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        sa.Column("step_ms", sa.Float(), nullable=False),
        sa.Column("peak_bytes", sa.BigInteger(), nullable=False),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("pareto_optimal", sa.Boolean(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column(
            "profile_id",
            sa.Integer(),
            sa.ForeignKey("mt_profiles.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_mt_results_job_id", "mt_results", ["job_id"])
    op.create_index(
        "ix_mt_results_lookup",
        "mt_results",
        ["gpu_key", "model_id", "batch", "budget_bytes"],
    )
    op.create_table(
        "mt_api_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    for table in (
        "mt_api_keys",
        "mt_results",
        "mt_job_claims",
        "mt_jobs",
        "mt_profiles",
        "mt_models",
    ):
        op.drop_table(table)
    op.drop_table("mt_gpu_types")
