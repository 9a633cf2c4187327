"""The system of record: the SQLite engine with its pragmas and migrations (``engine``), the SQLModel
tables (``tables``), online backup and verified restore (``backup``), and the Alembic ``migrations``.

Imports nothing of the appliance but ``settings`` and ``errors``.
"""
