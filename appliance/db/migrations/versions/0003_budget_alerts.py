"""Budget alerts: a threshold per quota, and one alert row per counter that crosses it.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quotas") as batch_op:
        batch_op.add_column(sa.Column("alert_percent", sa.Float(), nullable=True))
    op.create_table(
        "budget_alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("counter_id", sa.Integer(), nullable=False),
        sa.Column("subject_type", sa.String(length=8), nullable=False),
        sa.Column("subject_id", sa.Integer(), nullable=False),
        sa.Column("dimension", sa.String(length=32), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.Column("limit_value", sa.Float(), nullable=False),
        sa.Column("spent", sa.Float(), nullable=False),
        sa.Column("percent", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.Float(), nullable=False),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("dismissed_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("counter_id"),
    )
    with op.batch_alter_table("budget_alerts") as batch_op:
        batch_op.create_index(batch_op.f("ix_budget_alerts_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    op.drop_table("budget_alerts")
    with op.batch_alter_table("quotas") as batch_op:
        batch_op.drop_column("alert_percent")
