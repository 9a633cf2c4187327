"""Settings of the console: its session secret, budget alerts and their webhook, local sign-in and single sign-on."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, ValidationInfo, field_validator, model_validator


class ConsoleFields(BaseModel):
    """Console sessions, budget alerts and their signed webhook, and who may sign in (locally or through OIDC)."""

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
