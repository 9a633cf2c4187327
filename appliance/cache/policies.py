"""Cache policies: the box's defaults, the stored `global` and team policies, and a key's own.

The global and team policies are ``kv`` rows (``cache_policy:global``,
``cache_policy:team:<id>``), read once and kept in memory until changed; a key's
policy lives on its row and arrives with the principal.
"""

from __future__ import annotations

import dataclasses
import json

from appliance.accounts.keys import Principal
from appliance.cache.entries import EntryStore
from appliance.cache.keys import Policy, merge_policy, validate_policy
from appliance.jsontypes import JsonObject
from appliance.settings import Settings

POLICY_KV_PREFIX = "cache_policy:"


class CachePolicies:
    """Layered cache policies. ``semantic_available``: whether an embedder serves the semantic tier."""

    def __init__(self, settings: Settings, entries: EntryStore, semantic_available: bool):
        self._settings = settings
        self._entries = entries
        self._semantic_available = semantic_available
        self._stored: dict[str, JsonObject | None] = {}

    def base(self) -> Policy:
        """The defaults of this box, before any stored policy."""
        return Policy(
            semantic=self._semantic_available and self._settings.semantic_cache_enabled,
            semantic_threshold=float(self._settings.semantic_cache_threshold),
        )

    def for_principal(self, principal: Principal) -> Policy:
        """Defaults ← global policy ← team policy ← key policy; any `enabled: false` wins."""
        team = principal.team_id
        layers = (self._read("global"), self._read(f"team:{team}") if team is not None else None, principal.cache_policy)
        policy = merge_policy(self.base(), *layers)
        if policy.semantic and not self._semantic_available:
            policy = dataclasses.replace(policy, semantic=False)
        return policy

    def get(self, scope: str, ident: int | None = None) -> JsonObject | None:
        """The stored policy of `global` or `team` ``ident``."""
        return self._read(_policy_name(scope, ident))

    def set(self, scope: str, ident: int | None, policy: JsonObject | None) -> JsonObject | None:
        """Store (or with None, remove) the policy of `global` or `team` ``ident``; returns it as stored."""
        name = _policy_name(scope, ident)
        clean = validate_policy(policy) if policy is not None else None
        conn = self._entries.connect()
        try:
            if clean is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (POLICY_KV_PREFIX + name,))
            else:
                conn.execute(
                    "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (POLICY_KV_PREFIX + name, json.dumps(clean, sort_keys=True)),
                )
        finally:
            conn.close()
        self._stored.pop(name, None)
        return clean

    def forget(self) -> None:
        """Drop the policies held in memory; they are read again on next use."""
        self._stored.clear()

    def _read(self, name: str) -> JsonObject | None:
        if name not in self._stored:
            row = self._entries.reader().execute("SELECT value FROM kv WHERE key = ?", (POLICY_KV_PREFIX + name,)).fetchone()
            try:
                self._stored[name] = json.loads(row[0]) if row else None
            except ValueError:
                self._stored[name] = None
        return self._stored[name]


def _policy_name(scope: str, ident: int | None) -> str:
    if scope == "global":
        return "global"
    if scope == "team" and ident is not None:
        return f"team:{int(ident)}"
    raise ValueError("policy scope must be `global` or `team` with an id (key policies live on the key)")
