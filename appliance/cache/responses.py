"""The response cache: exact and semantic tiers in the appliance's own SQLite.

Read path (on the event loop, before admission): the request is normalized and
hashed (``cache_keys``), then looked up in an in-memory LRU of hot entries and,
on a miss there, by one indexed SELECT on ``cache_entries.cache_key``
(:mod:`~appliance.cache.exact`). The semantic tier (``lookup_async``) runs only
after an exact miss, and embeds the prompt on a worker thread
(:mod:`~appliance.cache.semantic_tier`).

Write path: ``store``/``store_stream`` only check policy and queue the answer
(a plain answer also goes straight into the hot LRU, so an immediate repeat
hits). One writer thread (:mod:`~appliance.cache.writer`) folds streams, embeds
prompts, and commits everything queued, plus the hit counts gathered since its
last batch, in one transaction (group commit), then evicts least-recently-used
rows above ``cache_max_entries`` and, once a minute, expired rows. Purges go
through the same queue, so they are ordered after every store queued before
them. A cache store acknowledges nothing to a client, so a crash may lose
queued stores.

The hot LRU, the semantic index and the database change only in the writer
(inserts, evictions, purges, expiry), except that lookups drop an expired hot
entry they find, which keeps the three coherent. Who may share an answer, and
whether the semantic tier applies, is the policy's (:mod:`~appliance.cache.policies`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import msgspec
from sqlalchemy import Engine

from appliance.accounts.keys import Principal
from appliance.cache.counters import CacheCounters
from appliance.cache.embedder import Embedder
from appliance.cache.entries import EntryStore
from appliance.cache.exact import ExactTier, HotEntries, HotEntry, PendingHits, StoredKeys
from appliance.cache.keys import (
    CacheableRequest,
    Policy,
    Prepared,
    cache_control,
    cache_key,
    is_deterministic,
    normalized,
    partition,
    scope_key,
    semantic_text,
)
from appliance.cache.policies import CachePolicies
from appliance.cache.replay import Hit, complete_response, usage_tokens
from appliance.cache.semantic import MAX_TEXT_CHARS
from appliance.cache.semantic_tier import SemanticTier
from appliance.cache.writer import CacheWriter
from appliance.jsontypes import JsonObject
from appliance.settings import Settings

#: The request headers the cache reads (``Cache-Control``).
RequestHeaders = Mapping[str, str] | None
_encode = msgspec.json.encode


class ResponseCache:
    """Exact and semantic response cache. See the module docstring for the read and write paths."""

    def __init__(self, settings: Settings, db_engine: Engine, embedder: Embedder | None = None):
        self.settings = settings
        self._rows = EntryStore(settings, db_engine)
        self._hot = HotEntries()
        self._hits = PendingHits()
        self._counters = CacheCounters()
        self._stored = StoredKeys()
        self._exact = ExactTier(settings, self._rows, self._hot, self._hits, self._stored)
        self._semantic = SemanticTier(embedder, self._rows, self._exact, self._counters) if embedder is not None else None
        self._policies = CachePolicies(settings, self._rows, semantic_available=embedder is not None)
        self._writer = CacheWriter(settings, self._rows, self._hot, self._hits, self._semantic, self._counters, self._stored)
        self._closed = False

    # ---------------------------------------------------------------- policy
    def base_policy(self) -> Policy:
        return self._policies.base()

    def policy_for(self, principal: Principal) -> Policy:
        """Defaults ← global policy ← team policy ← key policy; any `enabled: false` wins."""
        return self._policies.for_principal(principal)

    def get_policy(self, scope: str, ident: int | None = None) -> JsonObject | None:
        """The stored policy of `global` or `team` (kv rows); key policies live on the key row."""
        return self._policies.get(scope, ident)

    def set_policy(self, scope: str, ident: int | None, policy: JsonObject | None) -> JsonObject | None:
        """Store (or with None, remove) the policy of `global` or `team` ``ident``."""
        return self._policies.set(scope, ident, policy)

    # ---------------------------------------------------------------- keys
    def _prepare(
        self, principal: Principal, endpoint: str, model: str, body: CacheableRequest, headers: RequestHeaders
    ) -> Prepared | None:
        if not self.settings.cache_enabled:
            return None
        may_read, may_write = cache_control(headers)
        if not (may_read or may_write):
            return None
        policy = self._policies.for_principal(principal)
        if not policy.enabled or not (policy.cache_nondeterministic or is_deterministic(body)):
            return None
        doc = normalized(body)
        part = partition(principal, policy.share)
        prep = Prepared(
            endpoint, model, cache_key(part, endpoint, model, doc), policy, doc, part, principal.id, may_read, may_write
        )
        if policy.semantic:
            text = semantic_text(endpoint, doc)
            if text and len(text) <= MAX_TEXT_CHARS and text.strip():
                prep.text, prep.scope = text, scope_key(part, endpoint, model, doc)
        return prep

    def _readable(
        self, principal: Principal, endpoint: str, model: str, body: CacheableRequest, headers: RequestHeaders
    ) -> Prepared | None:
        """The prepared request when the cache may answer it; a lookup the client or policy bypasses is counted."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_read:
            if prep is not None or (self.settings.cache_enabled and cache_control(headers) == (False, False)):
                self._counters.add("bypassed")
            return None
        return prep

    # ---------------------------------------------------------------- lookups
    def lookup(
        self, principal: Principal, endpoint: str, model: str, body: CacheableRequest, headers: RequestHeaders
    ) -> Hit | None:
        """The exact tier only: synchronous, well under a millisecond."""
        prep = self._readable(principal, endpoint, model, body, headers)
        if prep is None:
            return None
        hit = self._exact.lookup(prep.key)
        self._counters.lookup(hit.tier if hit else "misses")
        return hit

    async def lookup_async(
        self, principal: Principal, endpoint: str, model: str, body: CacheableRequest, headers: RequestHeaders
    ) -> Hit | None:
        """Exact tier, then (on a miss, when policy allows) the semantic tier on the embedding thread."""
        prep = self._readable(principal, endpoint, model, body, headers)
        if prep is None:
            return None
        hit = self._exact.lookup(prep.key)
        if hit is None and prep.text is not None and self._semantic is not None:
            hit = await self._semantic.lookup(prep)
        self._counters.lookup(hit.tier if hit else "misses")
        return hit

    # ---------------------------------------------------------------- stores
    def store(
        self, principal: Principal, endpoint: str, model: str, body: CacheableRequest, result: JsonObject, headers: RequestHeaders
    ) -> None:
        """Queue a non-streamed response for the cache; returns at once."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_write or not complete_response(endpoint, result):
            return
        # serve an immediate repeat from memory while the writer commits the row
        self._hot.put(
            prep.key,
            HotEntry(None, endpoint, model, prep.key_id, result, *usage_tokens(result), time.time(), len(_encode(result))),
        )
        self._writer.store(prep, result)

    def store_stream(
        self,
        principal: Principal,
        endpoint: str,
        model: str,
        body: CacheableRequest,
        events: list[bytes],
        usage: JsonObject,
        headers: RequestHeaders,
    ) -> None:
        """Queue a streamed answer (its ``data:`` events and usage); folded into one response off the loop."""
        prep = self._prepare(principal, endpoint, model, body, headers)
        if prep is None or not prep.may_write or not events:
            return
        self._writer.store_stream(prep, events, usage)

    # ---------------------------------------------------------------- admin
    def purge(self, model: str | None = None, key_id: int | None = None) -> int:
        """Delete entries of a model, of a key, of both, or (neither given) all; returns how many."""
        return self._writer.purge(model, key_id)

    def expire_now(self) -> int:
        """Delete expired rows at once (the writer also does it every minute); returns how many."""
        return self._writer.expire_now()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far is written (tests, shutdown)."""
        self._writer.flush(timeout)

    def stats(self) -> JsonObject:
        entries, size, recorded_hits = self._rows.totals()
        s = self._counters.snapshot()
        hits = s["exact"] + s["semantic"]
        base = self._policies.base()
        return {
            "enabled": bool(self.settings.cache_enabled),
            "entries": entries,
            "bytes": size,
            "max_entries": self.settings.cache_max_entries,
            "ttl_seconds": self.settings.cache_ttl_seconds,
            "lookups": s["lookups"],
            "hits": hits,
            "misses": s["misses"],
            "hit_rate": round(hits / s["lookups"], 4) if s["lookups"] else 0.0,
            "hits_by_tier": {"exact": s["exact"], "semantic": s["semantic"]},
            "bypassed": s["bypassed"],
            "stores": s["stores"],
            "dropped_stores": s["dropped"],
            "evicted": s["evicted"],
            "expired": s["expired"],
            "purged": s["purged"],
            "hits_recorded": recorded_hits,
            "hot_entries": len(self._hot),
            "semantic": {
                "enabled": base.semantic,
                "model": self._semantic.embedder.name if self._semantic else None,
                "threshold": base.semantic_threshold,
                "vectors_loaded": self._semantic.index.vectors_loaded() if self._semantic else 0,
                "skipped_busy": s["semantic_skipped"],
            },
        }

    def clear_memory(self) -> None:
        """Forget every in-memory copy of cache rows (hot entries, semantic vectors, policies, pending hits).

        Called after a database restore: the rows those copies came from may be gone or different."""
        self._hot.clear()
        self._hits.take()
        if self._semantic is not None:
            self._semantic.forget()
        self._policies.forget()
        self._writer.recount()

    def close(self) -> None:
        """Write what is queued, stop the writer and the embedding thread."""
        if self._closed:
            return
        self._closed = True
        self._writer.stop()
        if self._semantic is not None:
            self._semantic.close()
