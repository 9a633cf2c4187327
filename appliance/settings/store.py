"""Settings of the model store: where pulls may go, the hub, and a read-only or offline store."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator


class StoreFields(BaseModel):
    """Pull destinations, the hub and its token, and the store's read-only and offline modes."""

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

    @field_validator("hub_url")
    @classmethod
    def _hub_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or any(ord(c) < 33 for c in value):
            raise ValueError("hub_url must be an http:// or https:// URL")
        return value.rstrip("/")
