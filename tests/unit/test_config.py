from __future__ import annotations

import pytest

from services.cli.common import env_settings
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import (
    Credentials,
    Settings,
    credentials_from_env,
    redact_url,
)
from tests.support.clirun import run_parsed


def started(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, *flags: str) -> Settings:
    """What ``run reconciler`` starts with: the settings as every command builds them."""
    result, settings = run_parsed(["run", "reconciler", *flags], env, monkeypatch)
    assert result.exit_code == 0, result.output
    assert settings is not None
    return settings


def refused(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    result, settings = run_parsed(["run", "reconciler"], env, monkeypatch)
    assert result.exit_code == 2, result.output
    assert settings is None
    return result.output


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_options().metrics_port == 0
    settings = started({}, monkeypatch)
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.metrics_port == 9464  # `run` and `up` serve /metrics unless told not to
    assert (settings.metrics_host, settings.stream_replicas) == ("127.0.0.1", 1)


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"NATS_URL": "nats://n1:4222", "METRICS_PORT": "9100", "LOG_LEVEL": "DEBUG"}
    settings = started(env, monkeypatch, "--nats-url", "nats://n2:4222")
    assert settings.nats_url == "nats://n2:4222"
    assert settings.metrics_port == 9100
    assert settings.log_level == "debug"


def test_settings_without_a_flag_are_read_from_their_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(env_settings("nats_url", "log_level", "log_format")) == {
        "metrics_host",
        "metrics_port",
        "stream_replicas",
        "nats_user",
        "nats_password",
    }
    env = {"METRICS_HOST": "0.0.0.0", "STREAM_REPLICAS": "3"}
    settings = started(env, monkeypatch)
    assert (settings.metrics_host, settings.stream_replicas) == ("0.0.0.0", 3)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"NATS_URL": "http://x"}, "NATS_URL"),
        ({"NATS_URL": "localhost:4222"}, "--nats-url"),
        ({"STREAM_REPLICAS": "2"}, "STREAM_REPLICAS"),
    ],
)
def test_bad_values_name_the_setting_and_the_fix(
    env: dict[str, str], names: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = refused(env, monkeypatch)
    assert names in output
    assert "use" in output


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"METRICS_PORT": "ninety"}, "--metrics-port"),
        ({"METRICS_PORT": "70000"}, "--metrics-port"),
        ({"LOG_LEVEL": "loud"}, "--log-level"),
        ({"LOG_FORMAT": "xml"}, "--log-format"),
        ({"STREAM_REPLICAS": "three"}, "STREAM_REPLICAS"),
    ],
)
def test_unparsable_values_are_usage_errors_naming_the_setting(
    env: dict[str, str], names: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert names in refused(env, monkeypatch)


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"metrics_port": 70000}, "--metrics-port / METRICS_PORT"),
        ({"log_level": "loud"}, "--log-level / LOG_LEVEL"),
        ({"log_format": "xml"}, "--log-format / LOG_FORMAT"),
        ({"stream_replicas": 2}, "--stream-replicas / STREAM_REPLICAS"),
    ],
)
def test_settings_are_checked_however_they_are_built(values: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_options(**values)
    assert names in str(info.value)
    assert "use" in str(info.value)


def test_nats_credentials_come_from_the_environment_and_stay_out_of_repr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = {"NATS_USER": "reconciler", "NATS_PASSWORD": "s3cret-pw"}
    settings = started(env, monkeypatch)
    assert settings.credentials == Credentials("reconciler", "s3cret-pw")
    assert "s3cret-pw" not in repr(settings)
    assert "s3cret-pw" not in repr(settings.credentials)
    assert started({}, monkeypatch).credentials is None
    assert credentials_from_env({"NATS_USER": "a", "NATS_PASSWORD": "b"}) == Credentials("a", "b")
    assert credentials_from_env({}) is None


@pytest.mark.parametrize(
    "env",
    [
        {"NATS_USER": "reconciler"},
        {"NATS_PASSWORD": "pw"},
        {"NATS_USER": "a", "NATS_PASSWORD": "b", "NATS_URL": "nats://c:d@n1:4222"},
    ],
)
def test_half_or_twice_given_credentials_are_refused(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    output = refused(env, monkeypatch)
    assert "NATS_USER" in output
    assert "d@" not in output


def test_a_bad_url_is_reported_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "hunter2" not in refused({"NATS_URL": "http://user:hunter2@n1:4222"}, monkeypatch)
    with pytest.raises(ConfigError) as info:
        Settings.from_options(nats_url="http://user:hunter2@n1:4222")
    assert "hunter2" not in str(info.value)
    assert "user:***@n1:4222" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://admin:pw@127.0.0.1:4222", "nats://admin:***@127.0.0.1:4222"),
        ("tls://u:p%40ss@nats.example:4222", "tls://u:***@nats.example:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://s3cret-token@127.0.0.1:4222", "nats://***@127.0.0.1:4222"),
        ("nats://[::1", "<unparsable URL>"),
    ],
)
def test_urls_are_shown_without_passwords(url: str, shown: str) -> None:
    assert redact_url(url) == shown
