"""Every setting knows where its value came from: command line, environment, config file or default."""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.settings import DEFAULT_ORIGIN, SettingOrigin, load_settings, trace_origins


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No APPLIANCE_* variable from the caller's shell, and the data dir in a temporary folder."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("APPLIANCE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def test_each_source_is_named_with_its_file_variable_or_option(clean_env, tmp_path):
    config = tmp_path / "appliance.toml"
    config.write_text('log_level = "debug"\nport = 9001\nqueue_size = 7\n')
    clean_env.setenv("APPLIANCE_CONFIG", str(config))
    clean_env.setenv("APPLIANCE_QUEUE_SIZE", "9")
    settings = load_settings(port=9100)

    assert settings.port == 9100 and settings.origin("port") == SettingOrigin("command line", "--port")
    assert settings.queue_size == 9 and settings.origin("queue_size") == SettingOrigin("environment", "APPLIANCE_QUEUE_SIZE")
    assert settings.log_level == "debug" and settings.origin("log_level") == SettingOrigin("config file", str(config))
    assert settings.origin("data_dir") == SettingOrigin("environment", "APPLIANCE_DATA_DIR")
    assert settings.origin("engine_parallel") == DEFAULT_ORIGIN
    assert str(settings.origin("log_level")) == f"config file {config}"
    assert str(settings.origin("engine_parallel")) == "default"


def test_environment_names_match_without_regard_to_case_as_the_loader_reads_them(clean_env):
    clean_env.setenv("appliance_queue_size", "11")
    settings = load_settings()
    assert settings.queue_size == 11
    assert settings.origin("queue_size") == SettingOrigin("environment", "appliance_queue_size")


def test_priority_follows_the_loader_command_line_then_environment_then_file():
    path = Path("/etc/appliance/appliance.toml")
    origins = trace_origins(
        ["port", "host", "log_level", "queue_size"],
        {"port": 1},
        {"APPLIANCE_PORT": "2", "APPLIANCE_HOST": "0.0.0.0", "OTHER": "x"},
        path,
        {"port": 3, "host": "::", "log_level": "info"},
    )
    assert origins == {
        "port": SettingOrigin("command line", "--port"),
        "host": SettingOrigin("environment", "APPLIANCE_HOST"),
        "log_level": SettingOrigin("config file", str(path)),
        "queue_size": DEFAULT_ORIGIN,
    }


def test_a_setting_unknown_to_the_record_reads_as_default(clean_env):
    assert load_settings().origin("no_such_setting") == DEFAULT_ORIGIN
