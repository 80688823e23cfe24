"""``mt_workers``: each worker process's heartbeat and the GPU types it serves, so that ``/healthz`` can tell a
queued GPU type that no live worker serves (NOTE [ Worker heartbeats ] in ``memtune.storage.repositories._workers``).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from memtune.storage.orm import UTCDateTime

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mt_workers",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("gpu_keys", sa.JSON(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_mt_workers_last_seen", "mt_workers", ["last_seen"])


def downgrade() -> None:
    op.drop_index("ix_mt_workers_last_seen", table_name="mt_workers")
    op.drop_table("mt_workers")
