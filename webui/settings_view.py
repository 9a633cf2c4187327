"""The settings page's rows: each setting's value as shown (secrets redacted) and where it came from."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr

from appliance.settings import SECRET_SETTINGS, Settings


def shown_value(settings: Settings, name: str) -> object:
    """The value as the console shows it: secrets as "(set)"/"(not set)", and URLs without user or password."""
    value = getattr(settings, name)
    if name in SECRET_SETTINGS:
        return "(set)" if value else ("(generated, in the data dir)" if name == "session_secret" else "(not set)")
    if isinstance(value, SecretStr):
        return "(set)"
    if isinstance(value, str) and "://" in value and "@" in value:
        parts = urlsplit(value)
        if parts.username or parts.password:
            host = parts.hostname or ""
            netloc = f"(redacted)@{host}" + (f":{parts.port}" if parts.port else "")
            return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return value


def settings_rows(settings: Settings) -> list[dict[str, object]]:
    return [
        {
            "name": name,
            "env": f"APPLIANCE_{name.upper()}",
            "value": shown_value(settings, name),
            "origin": settings.origin(name),
            "description": field.description,
        }
        for name, field in Settings.model_fields.items()
    ]
