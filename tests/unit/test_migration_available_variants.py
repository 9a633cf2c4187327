"""Migration 0007: the variant states are checked (``available`` among them) and the rows already there stay valid."""

import sqlite3

import pytest
from alembic import command

from appliance.db.engine import alembic_config, migrate


def test_existing_variants_survive_and_only_known_states_are_accepted(tmp_path):
    db = tmp_path / "a.db"
    command.upgrade(alembic_config(db), "0006")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO model_families (id, name, default_variant, created_at) VALUES (1, 'tiny', 'q8_0', 0)")
        for row_id, name, status in ((1, "q8_0", "ready"), (2, "f16", "downloading"), (3, "q4_0", "corrupt")):
            conn.execute(
                "INSERT INTO model_variants (id, family_id, name, format, path, size_bytes, status, pinned, created_at)"
                " VALUES (?, 1, ?, 'gguf', ?, 10, ?, 0, 0)",
                (row_id, name, f"tiny/{name}/tiny-{name}.gguf", status),
            )
    migrate(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, name, status FROM model_variants ORDER BY id").fetchall() == [
            (1, "q8_0", "ready"),
            (2, "f16", "downloading"),
            (3, "q4_0", "corrupt"),
        ]
        conn.execute(
            "INSERT INTO model_variants (family_id, name, format, path, size_bytes, status, pinned, created_at)"
            " VALUES (1, 'f32', 'gguf', '', 20, 'available', 0, 0)"
        )
        with pytest.raises(sqlite3.IntegrityError, match="ck_model_variants_status"):
            conn.execute(
                "INSERT INTO model_variants (family_id, name, format, path, size_bytes, status, pinned, created_at)"
                " VALUES (1, 'q2_k', 'gguf', '', 20, 'half-there', 0, 0)"
            )
    command.downgrade(alembic_config(db), "0006")  # available rows have no files: they go, the others stay
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM model_variants ORDER BY id")] == ["q8_0", "f16", "q4_0"]
