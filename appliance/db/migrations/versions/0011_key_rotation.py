"""Key rotation and key expiry alerts: the secrets a rotation replaced (each with the end of its overlap), and
``budget_alerts`` rows of a second kind, ``key_expiry``, which have no quota counter and are raised once per key,
expiry and threshold (``dedupe_key``).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _text(length: int | None = None) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "retired_key_secrets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=False),
        sa.Column("prefix", _text(16), nullable=False),
        sa.Column("secret_hash", _text(64), nullable=False),
        sa.Column("retired_at", sa.Float(), nullable=False),
        sa.Column("valid_until", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["key_id"], ["api_keys.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("retired_key_secrets") as batch_op:
        batch_op.create_index(batch_op.f("ix_retired_key_secrets_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_retired_key_secrets_prefix"), ["prefix"], unique=False)
        batch_op.create_index(batch_op.f("ix_retired_key_secrets_secret_hash"), ["secret_hash"], unique=True)
    with op.batch_alter_table("budget_alerts") as batch_op:
        batch_op.add_column(sa.Column("kind", _text(16), server_default="budget", nullable=False))
        batch_op.add_column(sa.Column("dedupe_key", _text(128), nullable=True))
        batch_op.alter_column("counter_id", existing_type=sa.Integer(), nullable=True)
        batch_op.create_unique_constraint("uq_budget_alerts_dedupe_key", ["dedupe_key"])


def downgrade() -> None:
    op.execute("DELETE FROM budget_alerts WHERE counter_id IS NULL")
    with op.batch_alter_table("budget_alerts") as batch_op:
        batch_op.drop_constraint("uq_budget_alerts_dedupe_key", type_="unique")
        batch_op.alter_column("counter_id", existing_type=sa.Integer(), nullable=False)
        batch_op.drop_column("dedupe_key")
        batch_op.drop_column("kind")
    with op.batch_alter_table("retired_key_secrets") as batch_op:
        batch_op.drop_index(batch_op.f("ix_retired_key_secrets_secret_hash"))
        batch_op.drop_index(batch_op.f("ix_retired_key_secrets_prefix"))
        batch_op.drop_index(batch_op.f("ix_retired_key_secrets_key_id"))
    op.drop_table("retired_key_secrets")
