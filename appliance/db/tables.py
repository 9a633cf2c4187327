"""SQLModel tables: the system of record.

Schema changes go through Alembic migrations in ``appliance/db/migrations``; a test
compares these tables with the migrated database so the two never drift.
Timestamps are UTC seconds since the epoch (floats), which SQLite stores and
compares cheaply.
"""

from __future__ import annotations

import time

from sqlalchemy import CheckConstraint, Column, Index, LargeBinary, UniqueConstraint
from sqlmodel import Field, SQLModel


def now() -> float:
    return time.time()


class User(SQLModel, table=True):
    """A console user. Passwords are argon2 hashes; users from single sign-on have none and carry
    ``sso_subject`` (the provider's issuer and subject), which keeps them off the local sign-in."""

    __tablename__ = "users"
    id: int | None = Field(default=None, primary_key=True)
    username: str = Field(unique=True, index=True, max_length=64)
    password_hash: str
    role: str = Field(default="viewer", max_length=16)  # admin | operator | viewer
    must_change_password: bool = False
    created_at: float = Field(default_factory=now)
    disabled: bool = False
    sso_subject: str | None = Field(default=None, unique=True, index=True, max_length=255)


class Team(SQLModel, table=True):
    """A team of API keys. Deleting one sets ``deleted_at`` and keeps the row (and its name, reserved),
    so past usage rows and revoked keys still name it."""

    __tablename__ = "teams"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, index=True, max_length=64)
    created_at: float = Field(default_factory=now)
    deleted_at: float | None = None


class ApiKey(SQLModel, table=True):
    """An API key. Only the sha256 of the secret is stored; the prefix is shown in lists."""

    __tablename__ = "api_keys"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=128)
    prefix: str = Field(index=True, max_length=16)
    secret_hash: str = Field(unique=True, index=True, max_length=64)
    role: str = Field(default="user", max_length=16)  # admin | user
    team_id: int | None = Field(default=None, foreign_key="teams.id", index=True)
    priority: str = Field(default="interactive", max_length=16)  # interactive | batch
    allowed_models: str | None = None  # JSON list of names; NULL = all
    cache_policy: str | None = None  # JSON object; NULL = defaults
    created_at: float = Field(default_factory=now)
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None


class RetiredSecret(SQLModel, table=True):
    """A key's secret replaced by a rotation: accepted for the key until ``valid_until`` (the overlap), then refused
    with a clear answer. Kept afterwards, so a client still sending it learns it was rotated."""

    __tablename__ = "retired_key_secrets"
    id: int | None = Field(default=None, primary_key=True)
    key_id: int = Field(foreign_key="api_keys.id", index=True)
    prefix: str = Field(index=True, max_length=16)
    secret_hash: str = Field(unique=True, index=True, max_length=64)
    retired_at: float = Field(default_factory=now)
    valid_until: float


class ModelFamily(SQLModel, table=True):
    __tablename__ = "model_families"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True, index=True, max_length=128)
    default_variant: str | None = Field(default=None, max_length=64)
    license: str | None = None
    description: str | None = None
    created_at: float = Field(default_factory=now)


VARIANT_STATES = "status IN ('downloading', 'ready', 'corrupt', 'available')"


class ModelVariant(SQLModel, table=True):
    """One variant of a family: an installed GGUF file or Hugging Face folder, or (``available``) one known on the
    hub and not downloaded, which has no files."""

    __tablename__ = "model_variants"
    __table_args__ = (UniqueConstraint("family_id", "name"), CheckConstraint(VARIANT_STATES, name="ck_model_variants_status"))
    id: int | None = Field(default=None, primary_key=True)
    family_id: int = Field(foreign_key="model_families.id", index=True)
    name: str = Field(max_length=64)  # e.g. q4_k_m, bf16
    format: str = Field(max_length=16)  # gguf | safetensors
    quantization: str | None = Field(default=None, max_length=32)
    path: str  # relative to the store
    size_bytes: int = 0
    sha256: str | None = Field(default=None, max_length=64)
    status: str = Field(default="ready", max_length=16, index=True)  # downloading | ready | corrupt | available
    source: str | None = None
    parent_variant_id: int | None = Field(default=None, foreign_key="model_variants.id")
    facts: str | None = None  # JSON: architecture facts from inspection
    pinned: bool = False
    created_at: float = Field(default_factory=now)


class Alias(SQLModel, table=True):
    """An admin-defined model name (e.g. `fast`) that resolves to family:variant."""

    __tablename__ = "aliases"
    name: str = Field(primary_key=True, max_length=64)
    target: str = Field(max_length=200)


class Instance(SQLModel, table=True):
    """A loaded engine instance (history kept; state is current for live ones)."""

    __tablename__ = "instances"
    id: int | None = Field(default=None, primary_key=True)
    variant_id: int = Field(foreign_key="model_variants.id", index=True)
    backend: str = Field(max_length=16)
    state: str = Field(max_length=16)  # loading | ready | failed | stopped
    pid: int | None = None
    plan: str | None = None  # JSON of the plan used
    started_at: float = Field(default_factory=now)
    stopped_at: float | None = None
    measured_bytes: int | None = None


class Calibration(SQLModel, table=True):
    """Measured memory footprint of a load, used to correct later estimates."""

    __tablename__ = "calibrations"
    __table_args__ = (UniqueConstraint("variant_key", "backend", "context"),)
    id: int | None = Field(default=None, primary_key=True)
    variant_key: str = Field(max_length=200)  # family:variant
    backend: str = Field(max_length=16)
    context: int
    estimated_bytes: int
    measured_bytes: int
    measured_at: float = Field(default_factory=now)
    estimated_decode_tps: float | None = None  # the planner's uncorrected decode tokens/s per stream
    measured_decode_tps: float | None = None  # what the engine decoded per stream
    decode_streams: int | None = None  # streams decoding together while it was measured


class Price(SQLModel, table=True):
    """Price per million tokens for a model (family or family:variant; `*` matches all)."""

    __tablename__ = "prices"
    model: str = Field(primary_key=True, max_length=200)
    input_per_m: float = 0.0
    output_per_m: float = 0.0
    cached_per_m: float = 0.0


class Quota(SQLModel, table=True):
    """Limits for a key or a team; NULL means no limit."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("subject_type", "subject_id"),)
    id: int | None = Field(default=None, primary_key=True)
    subject_type: str = Field(max_length=8)  # key | team
    subject_id: int
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    cost_per_month: float | None = None
    max_concurrent: int | None = None
    alert_percent: float | None = None  # budget alert threshold; NULL: the budget_alert_thresholds setting, 0: none


class QuotaCounter(SQLModel, table=True):
    """Spent and reserved amounts of one quota dimension in one window."""

    __tablename__ = "quota_counters"
    __table_args__ = (UniqueConstraint("subject_type", "subject_id", "dimension", "window_start"),)
    id: int | None = Field(default=None, primary_key=True)
    subject_type: str = Field(max_length=8)
    subject_id: int
    dimension: str = Field(max_length=32)  # requests_per_minute, tokens_per_day, cost_per_month, concurrent ...
    window_start: float
    limit_value: float
    spent: float = 0.0
    reserved: float = 0.0


class BudgetAlert(SQLModel, table=True):
    """An alert for the banner and the webhook. ``budget``: a budget counter that crossed one of its alert thresholds, at
    most one per counter and threshold, so one per threshold and window. ``key_expiry``: a key within a threshold of its
    expiry, at most one per key, expiry and threshold (``dedupe_key``)."""

    __tablename__ = "budget_alerts"
    __table_args__ = (UniqueConstraint("counter_id", "percent", name="uq_budget_alerts_counter_id_percent"),)
    id: int | None = Field(default=None, primary_key=True)
    created_at: float = Field(default_factory=now, index=True)
    kind: str = Field(default="budget", max_length=16, sa_column_kwargs={"server_default": "budget"})  # budget | key_expiry
    counter_id: int | None = None  # budget: quota_counters.id (kept after the counter is pruned); one alert per threshold
    dedupe_key: str | None = Field(default=None, unique=True, max_length=128)  # key_expiry: key, expiry and threshold
    subject_type: str = Field(max_length=8)
    subject_id: int
    dimension: str = Field(max_length=32)
    window_start: float
    limit_value: float
    spent: float  # when the threshold was crossed
    percent: float
    attempts: int = 0  # webhook deliveries tried
    next_attempt_at: float = 0.0
    delivered_at: float | None = None
    last_error: str | None = None
    dismissed_at: float | None = None


class Reservation(SQLModel, table=True):
    """An admitted request's hold on quota counters, until it settles."""

    __tablename__ = "reservations"
    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(unique=True, max_length=64)
    counters: str  # JSON list of [counter_id, amount]
    created_at: float = Field(default_factory=now)


class Usage(SQLModel, table=True):
    """The usage ledger: one row per request."""

    __tablename__ = "usage"
    __table_args__ = (
        Index("ix_usage_created", "created_at"),
        Index("ix_usage_key_created", "key_id", "created_at"),
        Index("ix_usage_team_created", "team_id", "created_at"),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_id: str = Field(unique=True, max_length=64)
    created_at: float = Field(default_factory=now)
    key_id: int | None = Field(default=None, foreign_key="api_keys.id")
    team_id: int | None = Field(default=None, foreign_key="teams.id")
    endpoint: str = Field(max_length=32)
    model: str = Field(max_length=200)
    variant: str | None = Field(default=None, max_length=64)
    backend: str | None = Field(default=None, max_length=16)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float | None = None
    latency_ms: float | None = None
    status: int = 200
    cache_tier: str = Field(default="miss", max_length=16)  # miss | exact | semantic
    cost: float = 0.0
    energy_joules: float | None = None
    batch_id: str | None = Field(default=None, index=True, max_length=64)  # set on the rows of batch lines


class UsageRollup(SQLModel, table=True):
    __tablename__ = "usage_rollups"
    __table_args__ = (UniqueConstraint("period", "bucket_start", "key_id", "team_id", "model"),)
    id: int | None = Field(default=None, primary_key=True)
    period: str = Field(max_length=8)  # hour | day
    bucket_start: float
    key_id: int | None = None
    team_id: int | None = None
    model: str = Field(max_length=200)
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost: float = 0.0


class CacheEntry(SQLModel, table=True):
    """A cached response. `embedding` holds float32 bytes for the semantic tier."""

    __tablename__ = "cache_entries"
    __table_args__ = (Index("ix_cache_entries_lru", "last_hit_at", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    cache_key: str = Field(unique=True, index=True, max_length=64)
    scope_key: str = Field(index=True, max_length=64)  # model + system prompt + sampling, for semantic matches
    model: str = Field(index=True, max_length=200)
    key_id: int | None = Field(default=None, index=True)
    endpoint: str = Field(max_length=32)
    prompt_text: str | None = None
    response: str  # JSON body of the non-streamed response
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding: bytes | None = Field(default=None, sa_column=Column(LargeBinary, nullable=True))
    created_at: float = Field(default_factory=now)
    last_hit_at: float = Field(default_factory=now)
    hits: int = 0
    size_bytes: int = 0


class Job(SQLModel, table=True):
    """Long work (pulls, quantizations, loads) with its progress."""

    __tablename__ = "jobs"
    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=32)
    state: str = Field(default="running", max_length=16)  # running | done | failed | cancelled
    target: str | None = None
    progress: float = 0.0
    done_bytes: int = 0
    total_bytes: int | None = None
    message: str | None = None
    created_at: float = Field(default_factory=now)
    finished_at: float | None = None


class AuditLog(SQLModel, table=True):
    """Who did what, when. Never holds a secret."""

    __tablename__ = "audit_log"
    id: int | None = Field(default=None, primary_key=True)
    created_at: float = Field(default_factory=now, index=True)
    actor: str = Field(max_length=128)  # user:alice | key:ak_1234 | local-admin
    action: str = Field(max_length=64)
    target: str | None = None
    detail: str | None = None


class Setting(SQLModel, table=True):
    """Small runtime state the daemon keeps (e.g. generated secrets' hashes, schema facts)."""

    __tablename__ = "kv"
    key: str = Field(primary_key=True, max_length=64)
    value: str


class StoredResponse(SQLModel, table=True):
    """A /v1/responses answer kept for ``previous_response_id`` and ``GET /v1/responses/{id}``, until it expires.

    Only the key that created it may read, continue or delete it (``key_id`` NULL: the local admin socket).
    """

    __tablename__ = "stored_responses"
    id: str = Field(primary_key=True, max_length=64)  # resp_…
    key_id: int | None = Field(default=None, index=True)
    model: str = Field(max_length=200)
    conversation: str  # JSON list of the input items answered, earlier turns included
    response: str  # JSON of the Responses object
    created_at: float = Field(default_factory=now)
    expires_at: float = Field(index=True)


from appliance.db.batch_tables import Batch, BatchFile, BatchResult  # noqa: E402,F401  (registers the Batch API's tables)
from appliance.db.request_log import RequestLogRow  # noqa: E402,F401  (registers request_log on the metadata)
