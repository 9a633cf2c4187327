"""Measured decode speed beside the measured footprint of a load (corrects the planner's speed estimates).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calibrations") as batch_op:
        batch_op.add_column(sa.Column("estimated_decode_tps", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("measured_decode_tps", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("decode_streams", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calibrations") as batch_op:
        batch_op.drop_column("decode_streams")
        batch_op.drop_column("measured_decode_tps")
        batch_op.drop_column("estimated_decode_tps")
