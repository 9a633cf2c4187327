"""What the cache page shows: figures, the global policy, and the policy of every team and key.

Each subject's row names its own override (or that it inherits) and the policy
its requests get, computed by the cache itself (defaults ← global ← team ← key).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.engine import Engine

from appliance.accounts.keys import KeyRing
from appliance.cache.responses import ResponseCache
from appliance.cache.subjects import SubjectPolicy, global_policy, key_policy, team_policy
from appliance.db.engine import session
from appliance.db.tables import Team
from appliance.settings import Settings
from appliance.webui import stats
from appliance.webui.render import TemplateContext

CACHE_SETTINGS = (
    "cache_enabled",
    "cache_ttl_seconds",
    "cache_max_entries",
    "cache_counts_against_quota",
    "semantic_cache_threshold",
)
STAT_FIELDS = ("entries", "bytes", "hit_rate", "lookups", "hits", "misses", "stores", "evicted", "expired", "purged")
SHARE_MODES = ("team", "key", "global")
POLICY_FLAGS = (("enabled", "Cache"), ("cache_nondeterministic", "Sampled too"), ("semantic", "Semantic"))


def subject_policies(cache: ResponseCache, keyring: KeyRing, db: Engine) -> list[SubjectPolicy]:
    """The global policy, then each team's, then each live key's."""
    with session(db) as s:
        teams = list(s.execute(select(Team).order_by(Team.name)).scalars())
    return [global_policy(cache), *(team_policy(cache, t) for t in teams), *(key_policy(cache, k) for k in keyring.list())]


def cache_context(
    cache: ResponseCache,
    db: Engine,
    settings: Settings,
    keyring: KeyRing,
    message: str | None = None,
    errors: dict[str, str] | None = None,
    policy_message: str | None = None,
) -> TemplateContext:
    """The cache page's context; ``errors`` and ``policy_message`` are shown beside the team and key override form."""
    raw = stats.cache_stats(cache) or {}
    base = cache.base_policy()
    policy = {
        **{f: getattr(base, f) for f in ("enabled", "cache_nondeterministic", "semantic", "semantic_threshold", "share")},
        **(cache.get_policy("global") or {}),
    }
    return {
        "stats": [(f, raw[f]) for f in STAT_FIELDS if f in raw],
        "semantic": raw.get("semantic"),
        "serving": stats.serving(db),
        "policy": policy,
        "share_modes": SHARE_MODES,
        "settings": [(name, getattr(settings, name)) for name in CACHE_SETTINGS],
        "message": message,
        "subjects": subject_policies(cache, keyring, db),
        "policy_flags": POLICY_FLAGS,
        "policy_errors": errors or {},
        "policy_message": policy_message,
    }
