"""How a key or team is named wherever one is shown: ``reporting-app (ak_N5X07USWQ…)``, ``team:research``.

A key's name says what it is for; its prefix says which secret it is (the name is not unique, the prefix is).
Alerts, the banner, budgets, cache overrides and usage reports all name keys through :func:`key_label`.
"""

from __future__ import annotations


def key_label(name: str | None, prefix: str | None, key_id: int | None = None) -> str:
    """``name (prefix…)``; the prefix alone when the key has no name, ``key:#<id>`` once the key is gone."""
    if not prefix:
        return f"key:#{key_id}" if key_id is not None else "key:?"
    return f"{name} ({prefix}…)" if name else f"{prefix}…"


def subject_label(
    subject_type: str, subject_id: int, *, key_name: str | None, key_prefix: str | None, team_name: str | None
) -> str:
    """The label of a quota subject: a key by :func:`key_label`, a team as ``team:<name>``, ``<type>:#<id>`` when gone."""
    if subject_type == "key":
        return key_label(key_name, key_prefix, subject_id)
    return f"team:{team_name}" if team_name else f"{subject_type}:#{subject_id}"
