"""Settings of the console: its session secret, budget alerts and their webhook, local sign-in and single sign-on."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator

MAX_ALERT_THRESHOLDS = 10


def _default_alert_thresholds() -> list[float]:
    return [80.0, 100.0]


class ConsoleFields(BaseModel):
    """Console sessions, budget alerts and their signed webhook, and who may sign in (locally or through OIDC)."""

    session_secret: str | None = Field(
        default=None, description="Secret for console session cookies. Unset: generated once and kept in the data dir."
    )
    budget_alert_thresholds: list[float] = Field(
        default_factory=_default_alert_thresholds,
        description=(
            "Shares (%) of a daily or monthly token or cost budget at which alerts are raised, each once per window "
            "(e.g. `[50, 80, 100]`); a quota's own `alert_percent` replaces them with its one share. Empty: no alerts."
        ),
    )
    budget_alert_percent: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description=(
            "The older one-share form of `budget_alert_thresholds`: when set, alerts are raised at this share only "
            "(0: no alerts)."
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

    @field_validator("budget_alert_thresholds")
    @classmethod
    def _alert_thresholds(cls, value: list[float]) -> list[float]:
        if any(not 0 < share <= 100 for share in value):
            raise ValueError("budget_alert_thresholds are shares of a budget: each more than 0 and at most 100")
        if len(value) > MAX_ALERT_THRESHOLDS:
            raise ValueError(f"budget_alert_thresholds holds at most {MAX_ALERT_THRESHOLDS} shares")
        return sorted(set(value))

    @model_validator(mode="after")
    def _webhook_is_signed(self) -> Self:
        if self.alert_webhook_url and not self.alert_webhook_secret:
            raise ValueError("alert_webhook_url needs alert_webhook_secret: receivers check each alert's signature")
        if self.alert_webhook_url and not self.alert_webhook_url.startswith(("http://", "https://")):
            raise ValueError("alert_webhook_url must be an http:// or https:// URL")
        return self

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
