"""Stored /v1/responses answers, for previous_response_id and GET /v1/responses/{id}.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "stored_responses",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("model", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("conversation", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("response", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("stored_responses") as batch_op:
        batch_op.create_index(batch_op.f("ix_stored_responses_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_stored_responses_expires_at"), ["expires_at"], unique=False)


def downgrade() -> None:
    op.drop_table("stored_responses")
