"""Budget alerts at several thresholds: a counter raises one alert per threshold it crosses (unique counter and
percent) instead of one alert in all.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# 0003 made counter_id unique without naming the constraint; batch mode finds it by this name.
NAMES = {"uq": "uq_%(table_name)s_%(column_0_name)s"}


def upgrade() -> None:
    with op.batch_alter_table("budget_alerts", naming_convention=NAMES) as batch_op:
        batch_op.drop_constraint("uq_budget_alerts_counter_id", type_="unique")
        batch_op.create_unique_constraint("uq_budget_alerts_counter_id_percent", ["counter_id", "percent"])


def downgrade() -> None:
    # One alert per counter again: keep each counter's first.
    op.execute(
        "DELETE FROM budget_alerts WHERE counter_id IS NOT NULL AND id NOT IN"
        " (SELECT min(id) FROM budget_alerts WHERE counter_id IS NOT NULL GROUP BY counter_id)"
    )
    with op.batch_alter_table("budget_alerts", naming_convention=NAMES) as batch_op:
        batch_op.drop_constraint("uq_budget_alerts_counter_id_percent", type_="unique")
        batch_op.create_unique_constraint("uq_budget_alerts_counter_id", ["counter_id"])
