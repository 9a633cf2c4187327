"""Alembic environment: migrations run programmatically from appliance.db.engine.migrate."""

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import appliance.db.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("alembic was started without sqlalchemy.url")
    engine = create_engine(url)
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")
        connection.commit()  # end SQLAlchemy's autobegun transaction, so Alembic's own one commits
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
