from __future__ import annotations

import pytest

from services.runtime.config import (
    ConfigError,
    Credentials,
    Settings,
    credentials_from_env,
    redact_url,
)


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.nats_url == "nats://127.0.0.1:4222"
    assert settings.metrics_port == 0


def test_env_then_flags() -> None:
    env = {"NATS_URL": "nats://n1:4222", "METRICS_PORT": "9100", "LOG_LEVEL": "DEBUG"}
    settings = Settings.from_env(env, nats_url="nats://n2:4222", metrics_port=None)
    assert settings.nats_url == "nats://n2:4222"
    assert settings.metrics_port == 9100
    assert settings.log_level == "debug"


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"NATS_URL": "http://x"}, "NATS_URL"),
        ({"NATS_URL": "localhost:4222"}, "--nats-url"),
        ({"METRICS_PORT": "ninety"}, "METRICS_PORT"),
        ({"METRICS_PORT": "70000"}, "--metrics-port"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"LOG_FORMAT": "xml"}, "--log-format"),
        ({"STREAM_REPLICAS": "2"}, "STREAM_REPLICAS"),
    ],
)
def test_bad_values_name_the_setting_and_the_fix(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert names in str(info.value)
    assert "use" in str(info.value)


def test_nats_credentials_come_from_the_environment_and_stay_out_of_repr() -> None:
    settings = Settings.from_env({"NATS_USER": "reconciler", "NATS_PASSWORD": "s3cret-pw"})
    assert settings.credentials == Credentials("reconciler", "s3cret-pw")
    assert "s3cret-pw" not in repr(settings)
    assert "s3cret-pw" not in repr(settings.credentials)
    assert Settings.from_env({}).credentials is None
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
def test_half_or_twice_given_credentials_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert "NATS_USER" in str(info.value)
    assert "d@" not in str(info.value)


def test_a_bad_url_is_reported_without_its_password() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"NATS_URL": "http://user:hunter2@n1:4222"})
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
