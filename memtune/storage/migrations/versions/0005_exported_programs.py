"""Exported programs: models submitted as ``torch.export`` archives.

``mt_model_programs`` holds each exported model's canonical ``.pt2`` archive (``memtune.profiler.exported``: checked
without running code from it, parameters' values dropped), keyed by the model's id; ``mt_models`` gains no column (its
``kind`` is ``exported``, its ``definition`` the program's inputs and sizes).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from memtune.storage.orm import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mt_model_programs",
        sa.Column(
            "model_id",
            sa.String(32),
            sa.ForeignKey("mt_models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("archive", sa.LargeBinary(), nullable=False),
        sa.Column("archive_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("mt_model_programs")
