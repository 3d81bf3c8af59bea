from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.errors import ConfigError
from service.settings import Settings, load_config_file


def test_defaults_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().database_url == "sqlite:///./gpuwarden.db"
    monkeypatch.setenv("GPUWARDEN_DATABASE_URL", "postgresql://u@db/gw")
    monkeypatch.setenv("GPUWARDEN_MAX_GAP_SECONDS", "30")
    s = Settings()
    assert s.database_url == "postgresql+psycopg://u@db/gw"
    assert s.max_gap_seconds == 30
    assert not s.is_sqlite


def test_bad_values_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWARDEN_DATABASE_URL", "mysql://x")
    with pytest.raises(ValidationError, match="database_url"):
        Settings()
    monkeypatch.delenv("GPUWARDEN_DATABASE_URL")
    monkeypatch.setenv("GPUWARDEN_IDLE_THRESHOLD", "1.5")
    with pytest.raises(ValidationError, match="idle_threshold"):
        Settings()


def test_config_file_expands_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text("channels:\n  - name: ops\n    url: ${HOOK_URL}\n")
    monkeypatch.setenv("HOOK_URL", "https://hooks.example.com/x")
    assert load_config_file(cfg) == {
        "channels": [{"name": "ops", "url": "https://hooks.example.com/x"}]
    }
    monkeypatch.delenv("HOOK_URL")
    with pytest.raises(ConfigError, match="HOOK_URL"):
        load_config_file(cfg)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "missing.yaml")
    assert load_config_file(None) == {}


def test_the_cli_client_settings_read_what_settings_reads(monkeypatch, tmp_path) -> None:
    from service.clientsettings import ClientSettings

    fields = ("central_url", "api_token", "state_dir", "log_level")
    for name in fields:
        monkeypatch.delenv(f"GPUWARDEN_{name.upper()}", raising=False)
    import os

    plain, client = Settings(), ClientSettings.load({}, os.environ)
    assert {f: getattr(plain, f) for f in fields} == {f: getattr(client, f) for f in fields}
    assert client.given == frozenset()
    monkeypatch.setenv("GPUWARDEN_CENTRAL_URL", "http://central:9000")
    monkeypatch.setenv("gpuwarden_api_token", "gw_lower")  # pydantic-settings ignores case
    monkeypatch.setenv("GPUWARDEN_STATE_DIR", str(tmp_path))
    full = Settings()
    client = ClientSettings.load({"log_level": "DEBUG"}, os.environ)
    assert {f: getattr(full, f) for f in fields[:3]} == {f: getattr(client, f) for f in fields[:3]}
    assert client.log_level == "DEBUG" and client.given == frozenset(fields)


def test_the_read_url_is_an_optional_postgresql_url(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().database_read_url is None
    monkeypatch.setenv("GPUWARDEN_DATABASE_READ_URL", "")
    assert Settings().database_read_url is None  # empty: no replica
    monkeypatch.setenv("GPUWARDEN_DATABASE_URL", "postgresql://u@primary/gw")
    monkeypatch.setenv("GPUWARDEN_DATABASE_READ_URL", "postgresql://u@replica/gw")
    assert Settings().database_read_url == "postgresql+psycopg://u@replica/gw"
    monkeypatch.setenv("GPUWARDEN_DATABASE_READ_URL", "sqlite:///./copy.db")
    with pytest.raises(ValidationError, match="database_read_url"):
        Settings()
    monkeypatch.setenv("GPUWARDEN_DATABASE_READ_URL", "postgresql://u@replica/gw")
    monkeypatch.delenv("GPUWARDEN_DATABASE_URL")
    with pytest.raises(ValidationError, match="follows a PostgreSQL primary"):
        Settings()  # the primary is the default SQLite file
    monkeypatch.setenv("GPUWARDEN_DATABASE_URL", "")
    monkeypatch.delenv("GPUWARDEN_DATABASE_READ_URL")
    with pytest.raises(ValidationError, match="database_url"):
        Settings()  # an empty primary URL stays an error


def test_token_commands_read_the_database_settings_as_settings_does() -> None:
    from service.clientsettings import DatabaseClientSettings

    env = {"GPUWARDEN_DATABASE_URL": "postgresql://u@h/db", "GPUWARDEN_STATE_DIR": "/tmp/s"}
    light = DatabaseClientSettings.load({}, env)
    assert light.database_url == "postgresql+psycopg://u@h/db"
    assert light.state_dir == Path("/tmp/s") and light.database_allow_maintenance is False
    flag = DatabaseClientSettings.load({"database_url": "sqlite:///x.db"}, env)
    assert flag.database_url == "sqlite:///x.db"
    assert DatabaseClientSettings.load({}, {}).database_url is None  # not given: resolved later
    allow = {"GPUWARDEN_DATABASE_ALLOW_MAINTENANCE": "true"}
    assert DatabaseClientSettings.load({}, allow).database_allow_maintenance is True
    with pytest.raises(ValueError, match="database_url: must start with sqlite://"):
        DatabaseClientSettings.load({}, {"GPUWARDEN_DATABASE_URL": "mysql://x"})
    with pytest.raises(ValueError, match="database_allow_maintenance"):
        DatabaseClientSettings.load({}, {"GPUWARDEN_DATABASE_ALLOW_MAINTENANCE": "maybe"})
