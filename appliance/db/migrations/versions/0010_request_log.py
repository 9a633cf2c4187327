"""The request log: one row per request answered (served, refused or failed), pruned by age and row count.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def _text(length: int | None = None) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "request_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("request_id", _text(64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("user", _text(200), nullable=True),
        sa.Column("address", _text(200), nullable=True),
        sa.Column("method", _text(8), nullable=False),
        sa.Column("endpoint", _text(200), nullable=False),
        sa.Column("model", _text(200), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("reason", _text(200), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("request_log") as batch_op:
        batch_op.create_index(batch_op.f("ix_request_log_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_request_log_request_id"), ["request_id"], unique=False)
        batch_op.create_index("ix_request_log_key_created", ["key_id", "created_at"], unique=False)


def downgrade() -> None:
    op.drop_table("request_log")
