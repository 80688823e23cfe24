"""An index on ``mt_jobs (owner, created_at)``: each job submission counts its API key's active jobs and the jobs it
submitted in the last hour (the per-key limits, ``memtune.api.service.routes.jobs``).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_mt_jobs_owner_created", "mt_jobs", ["owner", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_mt_jobs_owner_created", table_name="mt_jobs")
