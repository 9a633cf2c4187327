"""`appliancectl install --system` writes the listen address the service will read."""

import tomllib

from appliance.cli.setup import write_system_config


def test_a_new_config_has_the_defaults(tmp_path):
    path = tmp_path / "appliance.toml"
    write_system_config(path, {})
    assert tomllib.loads(path.read_text()) == {"data_dir": "/var/lib/appliance", "host": "0.0.0.0", "port": 8080}
    assert path.stat().st_mode & 0o777 == 0o640


def test_host_and_port_given_to_the_installer_land_in_the_config(tmp_path):
    path = tmp_path / "appliance.toml"
    write_system_config(path, {"port": 18080})
    assert tomllib.loads(path.read_text())["port"] == 18080


def test_an_existing_config_keeps_its_other_lines(tmp_path):
    path = tmp_path / "appliance.toml"
    path.write_text('# tuned by hand\ndata_dir = "/srv/appliance"\nport = 8080\n\n[extra]\nport_note = 1\n')
    write_system_config(path, {"port": 9090, "host": "127.0.0.1"})
    text = path.read_text()
    assert "# tuned by hand" in text
    config = tomllib.loads(text)
    assert config["data_dir"] == "/srv/appliance" and config["port"] == 9090 and config["host"] == "127.0.0.1"
    assert config["extra"] == {"port_note": 1}
    before = path.read_text()
    write_system_config(path, {})  # a re-run without --host/--port leaves the file alone
    assert path.read_text() == before


def test_a_port_inside_a_table_is_left_alone(tmp_path):
    path = tmp_path / "appliance.toml"
    path.write_text('data_dir = "/srv/appliance"\n\n[metrics]\nport = 9100\n')
    write_system_config(path, {"port": 18080})
    config = tomllib.loads(path.read_text())
    assert config["port"] == 18080 and config["metrics"] == {"port": 9100}
