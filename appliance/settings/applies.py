"""When a changed setting takes effect: at once ("live") or at the next start ("restart").

A setting is live only where every collaborator reads it from the one settings object each time it needs it
(or is told of the change, as the logger and the request log are), and a test changes it on a running daemon
and sees the new value used (``tests/integration/test_runtime_settings_daemon.py``,
``tests/browser/test_console_runtime_settings.py``). Everything else is copied at construction (the listener,
the engines and their workers, the planner, the admission queues, the console's sign-in options, the
scheduler's intervals) or has not been proved live yet, and is marked "restart": the file is changed now and
the daemon uses the value after its next start.
"""

from __future__ import annotations

from typing import Literal

Applies = Literal["live", "restart"]

#: Every setting, reviewed one by one: "live" where a test proves a change is used at once, else "restart".
#: Some "restart" settings are read at each use but have no such test yet (load_timeout_seconds,
#: responses_ttl_hours, cache_max_entries, the semantic cache's): they stay
#: "restart" until one proves them.
APPLIES: dict[str, Applies] = {
    # The service: the data dir, listener, log format and allocator are set up once at start; the log level
    # is set on the root logger again after a change.
    "data_dir": "restart",
    "host": "restart",
    "port": "restart",
    "allowed_hosts": "restart",
    "log_level": "live",
    "log_format": "restart",
    "allocator": "restart",
    # Models and engines: plans, queues and engine processes copy these when they are made.
    # default_model is live: the `default` alias is resolved again after a change; the gateway reads
    # request_timeout_seconds for each request. latency_targets: the engines' workers copy them.
    "default_model": "live",
    "seed_default_model": "restart",
    "max_loaded_instances": "restart",
    "memory_budget_gib": "restart",
    "memory_margin_gib": "restart",
    "idle_unload_seconds": "restart",
    "load_timeout_seconds": "restart",
    "request_timeout_seconds": "live",
    "embedding_inputs_in_flight_per_key": "restart",
    "queue_size": "restart",
    "queue_timeout_seconds": "restart",
    "drain_timeout_seconds": "restart",
    "engine_threads": "restart",
    "engine_adapt_threads": "restart",
    "engine_parallel": "restart",
    "engine_context": "restart",
    "engine_kv_cache_type": "restart",
    "min_decode_tokens_per_s": "restart",
    "latency_targets": "restart",
    "backend": "restart",
    "speculative_ngram": "restart",
    "vllm_python": "restart",
    "ray_address": "restart",
    # Usage: the cache's embedder copies these at start.
    # Live: currency (every page and report reads it as it renders), the cache's switch, TTL and quota counting
    # (read at each lookup, store and settle), the file and batch limits (read at each upload), the batch price (read when
    # a batch starts), the owner's costs (read by each usage report) and metrics_public (the access guard asks
    # for it at each /metrics request).
    "currency": "live",
    "cache_enabled": "live",
    "cache_ttl_seconds": "live",
    "cache_max_entries": "restart",
    "cache_counts_against_quota": "live",
    "semantic_cache_threshold": "restart",
    "semantic_cache_enabled": "restart",
    "cache_embedding_model": "restart",
    "cache_embedding_threads": "restart",
    "responses_ttl_hours": "restart",
    "request_log_days": "live",  # handed to the request log's writer, which prunes to them at once
    "request_log_max_rows": "live",
    "metrics_public": "live",
    "files_max_bytes": "live",
    "files_quota_bytes_per_key": "live",
    "batch_max_lines": "live",
    "batch_price_factor": "live",
    "batch_max_in_flight": "restart",
    "batch_reserved_slots": "restart",
    "batch_holdback_attainment": "restart",
    "box_cost_per_hour": "live",
    "energy_price_per_kwh": "live",
    "box_power_watts": "live",
    # The HTTP listener and TLS are built once at start.
    "trusted_proxies": "restart",
    "max_connections": "restart",
    "header_timeout_seconds": "restart",
    "body_timeout_seconds": "restart",
    "max_header_bytes": "restart",
    "max_header_count": "restart",
    "anonymous_connections_per_address": "restart",
    "tls": "restart",
    "tls_cert_file": "restart",
    "tls_key_file": "restart",
    "tls_hsts_seconds": "restart",
    "tls_redirect_port": "restart",
    # The model store and its hub client are built once at start.
    "allow_private_pull_hosts": "restart",
    "hub_url": "restart",
    "hub_token_file": "restart",
    "store_read_only": "restart",
    "offline": "restart",
    # The console: sessions and sign-in (local and SSO) are set up at start. Live: the alert webhook (each
    # delivery reads its URL and secret) and the budget alert shares (each settle reads them).
    "session_secret": "restart",
    "budget_alert_thresholds": "live",
    "budget_alert_percent": "live",
    "alert_webhook_url": "live",
    "alert_webhook_secret": "live",
    "local_login_enabled": "restart",
    "console_public_url": "restart",
    "oidc_issuer": "restart",
    "oidc_client_id": "restart",
    "oidc_client_secret": "restart",
    "oidc_client_secret_file": "restart",
    "oidc_provider_name": "restart",
    "oidc_scopes": "restart",
    "oidc_username_claim": "restart",
    "oidc_groups_claim": "restart",
    "oidc_group_roles": "restart",
    "oidc_default_role": "restart",
}


def applies(name: str) -> Applies:
    """When a change of setting ``name`` takes effect."""
    return APPLIES.get(name, "restart")
