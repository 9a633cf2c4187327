"""Indexes for per-team usage reports and cache LRU eviction.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch_op:
        batch_op.create_index("ix_usage_team_created", ["team_id", "created_at"], unique=False)
    with op.batch_alter_table("cache_entries") as batch_op:
        batch_op.create_index("ix_cache_entries_lru", ["last_hit_at", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("cache_entries") as batch_op:
        batch_op.drop_index("ix_cache_entries_lru")
    with op.batch_alter_table("usage") as batch_op:
        batch_op.drop_index("ix_usage_team_created")
