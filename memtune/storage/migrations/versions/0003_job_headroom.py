"""Budget headroom on jobs: the fraction of the budget the search keeps free for the caching allocator.

``mt_jobs`` gains ``headroom`` (NOTE [ Headroom ] in ``memtune.tuner.search``): a job's plans are searched against
``budget_bytes * (1 - headroom)``; ``budget_bytes`` stays the budget asked for. New jobs store the headroom
they were tuned at (the GPU type's calibration unless the request gave one). Existing jobs read 0.0: they
were tuned without headroom.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.add_column(sa.Column("headroom", sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.drop_column("headroom")
