import pytest

from appliance.errors import ConfigError
from appliance.settings import Settings, load_settings


def test_env_moves_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "d"))
    settings = load_settings()
    assert settings.data_dir == (tmp_path / "d").resolve()
    assert settings.db_path == settings.data_dir / "appliance.db"
    assert settings.admin_socket.parent == settings.data_dir / "run"


def test_bad_value_names_field_and_expectation(monkeypatch):
    monkeypatch.setenv("APPLIANCE_PORT", "eighty")
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = info.value.message
    assert "port (APPLIANCE_PORT)" in message
    assert "integer" in message and "'eighty'" in message


def test_out_of_range_value(monkeypatch):
    monkeypatch.setenv("APPLIANCE_PORT", "70000")
    with pytest.raises(ConfigError, match=r"port .*less than or equal to 65535"):
        load_settings()


def test_unknown_toml_key_is_refused(monkeypatch, tmp_path):
    config = tmp_path / "appliance.toml"
    config.write_text("porrt = 9000\n")
    monkeypatch.setenv("APPLIANCE_CONFIG", str(config))
    with pytest.raises(ConfigError, match="porrt"):
        load_settings()


def test_toml_file_is_read_and_env_wins(monkeypatch, tmp_path):
    config = tmp_path / "appliance.toml"
    config.write_text('port = 9001\nhost = "0.0.0.0"\n')
    monkeypatch.setenv("APPLIANCE_CONFIG", str(config))
    monkeypatch.setenv("APPLIANCE_PORT", "9002")
    settings = load_settings()
    assert settings.host == "0.0.0.0"
    assert settings.port == 9002


def test_every_field_is_documented():
    for name, field in Settings.model_fields.items():
        assert field.description and len(field.description) > 15, name
