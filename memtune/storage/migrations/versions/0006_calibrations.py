"""Calibrations per GPU type, and where a job's headroom came from.

``mt_calibrations`` holds one calibration per GPU type key (``memtune.tuner.calibration``: its JSON object, its
``source``, who measured or sent it, when), written by the workers that measure a GPU type first and by
``PUT /v1/gpus/{key}/calibration`` (NOTE [ Calibrations in the service ] in ``memtune.api.service.worker``). ``mt_jobs``
gains ``headroom_source`` (``request``, ``database``, ``user file``, ``committed`` or ``none``); jobs stored before read
null: where their headroom came from was not recorded.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from memtune.storage.orm import UTCDateTime

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mt_calibrations",
        sa.Column("gpu_key", sa.String(64), primary_key=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("measured_by", sa.String(200), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    with op.batch_alter_table("mt_jobs") as batch:
        batch.add_column(sa.Column("headroom_source", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.drop_column("headroom_source")
    op.drop_table("mt_calibrations")
