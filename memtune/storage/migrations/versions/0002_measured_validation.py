"""Measured validation: a job can ask for its top plans to be measured on the GPU.

``mt_jobs`` gains the request (``validate_top_k``, ``validate_iters``), the outcome (``validation_state``,
``validation_device``, ``validation_note``) and the measured unplanned step; ``mt_results`` gains the
simulator's prediction beside a measured row (``predicted_step_ms``, ``predicted_peak_bytes``) and the
measured ``reserved_peak_bytes`` and ``samples_per_s``. Existing jobs read as not validated (top-k 0).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_JOB_COLUMNS = (
    "validate_top_k",
    "validate_iters",
    "validation_state",
    "validation_device",
    "validation_note",
    "measured_unconstrained_step_ms",
    "measured_unconstrained_peak_bytes",
)
_RESULT_COLUMNS = ("predicted_step_ms", "predicted_peak_bytes", "reserved_peak_bytes", "samples_per_s")


def upgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.add_column(sa.Column("validate_top_k", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("validate_iters", sa.Integer(), nullable=False, server_default="6"))
        batch.add_column(sa.Column("validation_state", sa.String(16), nullable=True))
        batch.add_column(sa.Column("validation_device", sa.String(200), nullable=True))
        batch.add_column(sa.Column("validation_note", sa.Text(), nullable=True))
        batch.add_column(sa.Column("measured_unconstrained_step_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("measured_unconstrained_peak_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("mt_results") as batch:
        batch.add_column(sa.Column("predicted_step_ms", sa.Float(), nullable=True))
        batch.add_column(sa.Column("predicted_peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("reserved_peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("samples_per_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mt_results") as batch:
        for name in reversed(_RESULT_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("mt_jobs") as batch:
        for name in reversed(_JOB_COLUMNS):
            batch.drop_column(name)
