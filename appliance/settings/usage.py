"""Settings of what requests use and cost: the response cache, stored responses, files, batches and prices."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


class UsageFields(BaseModel):
    """The currency, the response cache, stored responses, the request log, /metrics access, files and batches, and the
    box's costs."""

    currency: str = Field(
        default="USD",
        min_length=1,
        max_length=8,
        pattern=r"^[A-Za-z$€£¥]{1,8}$",
        description=(
            "What prices and cost budgets are written in (a code such as USD or EUR, or a sign), shown beside every cost in the "
            "console and in `/admin/usage`. A label only: nothing is converted."
        ),
    )
    cache_enabled: bool = Field(default=True, description="Serve repeated deterministic requests from the response cache.")
    cache_ttl_seconds: int = Field(
        default=86400, ge=0, description="How long a cached response stays valid, in seconds. 0 keeps entries until evicted."
    )
    cache_max_entries: int = Field(
        default=100_000, ge=0, description="Most cached responses kept; least-recently-used are evicted."
    )
    cache_counts_against_quota: bool = Field(
        default=True, description="Whether tokens served from the cache count against token quotas."
    )
    semantic_cache_threshold: float = Field(
        default=0.95,
        gt=0,
        le=1,
        description=(
            "Cosine similarity a semantic cache hit needs (besides equal numbers, units, negations and names). At 0.95: no "
            "wrong answer on the 200 tuning and 100 held-out labelled pairs in tests/data, 4 wrong on the fresh held-out set's "
            "41 near misses (see Response cache)."
        ),
    )
    semantic_cache_enabled: bool = Field(
        default=False,
        description=(
            "Also answer from the cache when a cached prompt means the same (embedding similarity). Off by default: every cache "
            "miss then costs an embedding (about 10 ms of CPU). Policies can turn it on for a team or key."
        ),
    )
    cache_embedding_model: Path | None = Field(
        default=None, description="GGUF embedding model of the semantic cache. Unset: the shipped all-MiniLM-L6-v2."
    )
    cache_embedding_threads: int = Field(default=1, ge=1, description="CPU threads that embed prompts for the semantic cache.")
    responses_ttl_hours: float = Field(
        default=720,
        gt=0,
        description=(
            "How long a /v1/responses answer is kept for `previous_response_id` and `GET /v1/responses/{id}`, in hours. A "
            "request with `store: false` is not kept at all."
        ),
    )
    request_log_days: int = Field(
        default=14,
        ge=1,
        description=(
            "How many days the request log (console Requests page, `/admin/requests`) keeps each request, served, refused "
            "or failed; older rows are pruned every minute."
        ),
    )
    request_log_max_rows: int = Field(
        default=500_000,
        ge=1000,
        description=(
            "Most requests the request log keeps (a row is about 200 bytes); past it by 1,000 rows, the oldest are deleted. "
            "A flood of refused requests therefore never grows the table further."
        ),
    )
    metrics_public: bool = Field(
        default=False, description="Serve /metrics without an admin credential (only on trusted networks)."
    )
    files_max_bytes: int = Field(
        default=100 * 1024 * 1024,
        ge=1,
        description=(
            "Largest file `POST /v1/files` accepts, in bytes (a batch input of JSONL lines). A larger upload is refused with "
            "413 before its body is read."
        ),
    )
    files_quota_bytes_per_key: int = Field(
        default=1024 * 1024 * 1024,
        ge=1,
        description=(
            "Most bytes of files (batch inputs, outputs and error files) one API key may keep in the data dir; an upload past "
            "it gets 413."
        ),
    )
    batch_max_lines: int = Field(default=50_000, ge=1, description="Most request lines one batch input file may hold.")
    batch_price_factor: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description=(
            "What a batch line costs, as a share of the list price (the usage row and the cost budgets both see the discounted "
            "cost)."
        ),
    )
    batch_max_in_flight: int = Field(
        default=4,
        ge=1,
        description=(
            "Most batch lines, of all batches together, running at once. Each runs only while a slot of its model is free and "
            "nothing waits in that model's queue."
        ),
    )
    batch_reserved_slots: int = Field(
        default=1,
        ge=0,
        description=(
            "Slots of each model that batch lines leave free for interactive requests while any other request is running (with "
            "nothing else running, one batch line may always run)."
        ),
    )
    batch_holdback_attainment: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description=(
            "Share of interactive requests of the last 5 minutes that must have met their latency targets (TTFT and TPOT of "
            "`latency_targets`) for batch lines to start: below it, no new batch line starts until interactive attainment "
            "recovers. 0 never holds batch work back."
        ),
    )
    box_cost_per_hour: float = Field(
        default=0.0,
        ge=0,
        description=(
            "What the box costs its owner per hour, hardware amortised (and hosting, if you like), in `currency`. With it the "
            "console, `/metrics`, `appliancectl usage` and the usage CSV show what a token costs the owner. 0: unknown."
        ),
    )
    energy_price_per_kwh: float = Field(
        default=0.0,
        ge=0,
        description="Price of a kilowatt-hour of electricity, in `currency`. 0: energy is left out of the cost.",
    )
    box_power_watts: float = Field(
        default=0.0,
        ge=0,
        description=(
            "The box's power draw in watts, used for the energy cost of a window whose requests recorded no measured energy "
            "(RAPL/NVML not readable): this draw for the whole window. 0: such windows have no energy cost."
        ),
    )
