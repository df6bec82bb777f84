from __future__ import annotations

import pytest

from services.runtime.config import ConfigError, Settings


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
