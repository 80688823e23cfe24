"""Allocator retries on results: predicted by the placement model or counted on the GPU.

``mt_results`` gains ``alloc_retries`` (retries per step under the budget's cap, NOTE [ Allocator placement ] in
``memtune.tuner.placement``) and ``allocator_ms`` (for simulated rows, the predicted retries' price in ms, which is part
of ``step_ms``; NOTE [ Placement ranking ] in ``memtune.tuner.search``). Both are null for rows stored before.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mt_results") as batch:
        batch.add_column(sa.Column("alloc_retries", sa.Float(), nullable=True))
        batch.add_column(sa.Column("allocator_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mt_results") as batch:
        batch.drop_column("allocator_ms")
        batch.drop_column("alloc_retries")
