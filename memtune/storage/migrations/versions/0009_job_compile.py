"""Whole-model compile on jobs: whether a job's plans may compile the whole model, and what the worker did about it.

``mt_jobs`` gains ``compile`` (``auto``, ``on``, ``off``; NOTE [ Whole-model compile ] in ``memtune.tuner._whole``, NOTE
[ Compiler points in the service ] in ``memtune.api.service.worker``) and ``compile_note`` (the compiler points
measured, or why none were used). Existing jobs read ``auto``: they were tuned on their profiles as stored, compiler
points and all.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.add_column(sa.Column("compile", sa.String(8), nullable=False, server_default="auto"))
        batch.add_column(sa.Column("compile_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mt_jobs") as batch:
        batch.drop_column("compile_note")
        batch.drop_column("compile")
