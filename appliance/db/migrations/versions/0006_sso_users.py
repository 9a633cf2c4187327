"""Console users from single sign-on: the provider's issuer and subject.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch_op:
        batch_op.add_column(sa.Column("sso_subject", sqlmodel.sql.sqltypes.AutoString(length=255), nullable=True))
        batch_op.create_index(batch_op.f("ix_users_sso_subject"), ["sso_subject"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("users") as batch_op:
        batch_op.drop_index(batch_op.f("ix_users_sso_subject"))
        batch_op.drop_column("sso_subject")
