"""The Batch API: files, batches and line results; usage rows name the batch a line belongs to.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def _text(length: int | None = None) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    with op.batch_alter_table("usage") as batch_op:
        batch_op.add_column(sa.Column("batch_id", _text(64), nullable=True))
        batch_op.create_index(batch_op.f("ix_usage_batch_id"), ["batch_id"], unique=False)
    op.create_table(
        "files",
        sa.Column("id", _text(64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("purpose", _text(32), nullable=False),
        sa.Column("filename", _text(255), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("endpoints", _text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("files") as batch_op:
        batch_op.create_index(batch_op.f("ix_files_key_id"), ["key_id"], unique=False)
    op.create_table(
        "batches",
        sa.Column("id", _text(64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("input_file_id", _text(64), nullable=False),
        sa.Column("endpoint", _text(64), nullable=False),
        sa.Column("completion_window", _text(16), nullable=False),
        sa.Column("status", _text(16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("output_file_id", _text(64), nullable=True),
        sa.Column("error_file_id", _text(64), nullable=True),
        sa.Column("errors", _text(), nullable=True),
        sa.Column("metadata_json", _text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("in_progress_at", sa.Float(), nullable=True),
        sa.Column("finalizing_at", sa.Float(), nullable=True),
        sa.Column("completed_at", sa.Float(), nullable=True),
        sa.Column("failed_at", sa.Float(), nullable=True),
        sa.Column("expired_at", sa.Float(), nullable=True),
        sa.Column("cancelling_at", sa.Float(), nullable=True),
        sa.Column("cancelled_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("batches") as batch_op:
        batch_op.create_index(batch_op.f("ix_batches_key_id"), ["key_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_batches_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_batches_created_at"), ["created_at"], unique=False)
    op.create_table(
        "batch_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("batch_id", _text(64), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("custom_id", _text(), nullable=False),
        sa.Column("request_id", _text(64), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("body", _text(), nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("batch_id", "line"),
    )
    with op.batch_alter_table("batch_results") as batch_op:
        batch_op.create_index(batch_op.f("ix_batch_results_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:
    op.drop_table("batch_results")
    op.drop_table("batches")
    op.drop_table("files")
    with op.batch_alter_table("usage") as batch_op:
        batch_op.drop_index(batch_op.f("ix_usage_batch_id"))
        batch_op.drop_column("batch_id")
