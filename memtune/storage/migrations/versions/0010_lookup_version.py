"""``mt_lookup_version``: one counter, raised in the same transaction as every write to results, models and GPU
types, so that an API process can tell when its cached lookups are out of date (NOTE [ Lookup version ] in
``memtune.storage._lookup_version``).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "mt_lookup_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("mt_lookup_version")
