"""Variants known but not downloaded: the state ``available`` beside ``downloading``, ``ready`` and ``corrupt``.

A hub pull registers every GGUF variant of the repository; those not downloaded are rows in state
``available`` (name, quantization, size, source; no files). Existing rows keep their states, all of
which the new check accepts; the index serves the queries by state (unfinished installs, the
available variants of a family).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

STATES = "status IN ('downloading', 'ready', 'corrupt', 'available')"


def upgrade() -> None:
    with op.batch_alter_table("model_variants") as batch_op:
        batch_op.create_check_constraint("ck_model_variants_status", STATES)
        batch_op.create_index(batch_op.f("ix_model_variants_status"), ["status"], unique=False)


def downgrade() -> None:
    op.execute("DELETE FROM model_variants WHERE status = 'available'")
    with op.batch_alter_table("model_variants") as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_variants_status"))
        batch_op.drop_constraint("ck_model_variants_status", type_="check")
