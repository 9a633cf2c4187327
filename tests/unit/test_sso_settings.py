"""Single sign-on settings: both halves or neither, the secret from the environment or a file, never echoed."""

from __future__ import annotations

import pytest

from appliance.errors import ConfigError
from appliance.settings import load_settings
from appliance.sso.signon import sso_config

CANARY = "canary-oidc-secret-77f1"


def test_issuer_and_client_id_come_together(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLIANCE_OIDC_CLIENT_SECRET", CANARY)
    for half in (
        {"oidc_issuer": "https://idp.example"},
        {"oidc_client_id": "console"},
        {"oidc_issuer": "ftp://idp.example", "oidc_client_id": "console"},
    ):
        with pytest.raises(ConfigError) as caught:
            load_settings(data_dir=tmp_path, **half)
        assert CANARY not in str(caught.value)
    assert sso_config(load_settings(data_dir=tmp_path)) is None


def test_secret_from_the_environment_or_a_file_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("APPLIANCE_OIDC_CLIENT_SECRET", raising=False)
    (tmp_path / "oidc.secret").write_text(CANARY + "\n")
    config = sso_config(
        load_settings(
            data_dir=tmp_path,
            oidc_issuer="https://idp.example",
            oidc_client_id="c",
            oidc_client_secret_file="oidc.secret",
            oidc_scopes=["email", "openid", "groups"],
        )
    )
    assert config is not None and config.client_secret is not None
    assert config.client_secret.get_secret_value() == CANARY and CANARY not in repr(config)
    assert config.scopes == ("openid", "email", "groups")
    monkeypatch.setenv("APPLIANCE_OIDC_CLIENT_SECRET", "from-env")
    settings = load_settings(
        data_dir=tmp_path, oidc_issuer="https://idp.example", oidc_client_id="c", oidc_client_secret_file="oidc.secret"
    )
    assert sso_config(settings).client_secret.get_secret_value() == "from-env"  # the environment wins
    assert "from-env" not in settings.model_dump_json() and "from-env" not in repr(settings)


def test_an_unreadable_secret_file_is_a_config_error_naming_the_setting_only(tmp_path, monkeypatch):
    monkeypatch.delenv("APPLIANCE_OIDC_CLIENT_SECRET", raising=False)
    settings = load_settings(
        data_dir=tmp_path, oidc_issuer="https://idp.example", oidc_client_id="c", oidc_client_secret_file="missing.secret"
    )
    with pytest.raises(ConfigError, match="oidc_client_secret_file cannot be read"):
        sso_config(settings)
