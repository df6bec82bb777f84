"""Settings shared by every service, from flags and the environment.

Invalid settings fail at start-up with the flag and variable named and the fix stated: a service
that starts with a typo in its NATS URL would otherwise look healthy while doing nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any
from urllib.parse import urlparse, urlsplit, urlunsplit

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("console", "json")


class ConfigError(ValueError):
    """A setting is invalid; the message names the flag, the variable and the fix."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """A NATS user and password. The password stays out of ``repr``, so a logged object or a
    traceback never shows it."""

    user: str
    password: str = field(repr=False)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``: URLs are logged and printed, and a user may
    have put ``user:password@`` into one (nats-py accepts it). A lone ``name@`` is a token to
    nats-py, so it goes too."""
    try:
        parts = urlsplit(url)
        if parts.username is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        who = "***" if parts.password is None else f"{parts.username}:***"
        return urlunsplit(parts._replace(netloc=f"{who}@{host}"))
    except ValueError:
        return "<unparsable URL>"


def url_has_credentials(url: str) -> bool:
    try:
        return urlsplit(url).username is not None
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class Settings:
    nats_url: str = DEFAULT_NATS_URL
    log_level: str = "info"
    log_format: str = "console"
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    stream_replicas: int = 1
    service_name: str = "egress-proxies"
    nats_user: str = ""
    nats_password: str = field(default="", repr=False)

    @property
    def credentials(self) -> Credentials | None:
        """From ``NATS_USER``/``NATS_PASSWORD``; None when they are unset, so a ``user:password``
        in the URL, or the local credentials of ``egress-proxies up``, apply instead."""
        if not self.nats_user:
            return None
        return Credentials(self.nats_user, self.nats_password)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Flags (``overrides`` that are not None) win over the environment, which wins over
        the defaults."""
        env = os.environ if env is None else env
        raw: dict[str, object] = {}
        for f in fields(cls):
            var = _ENV_VARS.get(f.name)
            if var and env.get(var):
                raw[f.name] = env[var]
        raw.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        coerced: dict[str, Any] = {k: _coerce(k, v) for k, v in raw.items()}
        settings = replace(cls(), **coerced)
        settings.validate()
        return settings

    def validate(self) -> None:
        try:
            url = urlparse(self.nats_url)
            valid = url.scheme in ("nats", "tls", "ws", "wss") and bool(url.hostname)
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(
                f"--nats-url / NATS_URL: {redact_url(self.nats_url)!r} is not a NATS URL; "
                "use e.g. nats://127.0.0.1:4222"
            )
        _check_pair(self.nats_user, self.nats_password)
        if self.nats_user and url_has_credentials(self.nats_url):
            raise ConfigError(
                "--nats-url / NATS_URL carries a user, and NATS_USER is set too: use one of them"
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"--log-level / LOG_LEVEL: {self.log_level!r}; use one of {', '.join(LOG_LEVELS)}"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"--log-format / LOG_FORMAT: {self.log_format!r}; "
                f"use one of {', '.join(LOG_FORMATS)}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"--metrics-port / METRICS_PORT: {self.metrics_port} is not a port; "
                "use 1-65535, or 0 to turn the metrics endpoint off"
            )
        if self.stream_replicas not in (1, 3, 5):
            raise ConfigError(
                f"--stream-replicas / STREAM_REPLICAS: {self.stream_replicas}; "
                "use 1 on one server, 3 (or 5) in a cluster"
            )


def credentials_from_env(env: Mapping[str, str] | None = None) -> Credentials | None:
    """What a command that takes only a URL connects with, besides the URL's own user."""
    env = os.environ if env is None else env
    user, password = env.get("NATS_USER", ""), env.get("NATS_PASSWORD", "")
    _check_pair(user, password)
    return Credentials(user, password) if user else None


def _check_pair(user: str, password: str) -> None:
    if bool(user) != bool(password):
        raise ConfigError(
            "NATS_USER / NATS_PASSWORD: set both (the NATS user and its password) or neither"
        )


_ENV_VARS = {
    "nats_url": "NATS_URL",
    "log_level": "LOG_LEVEL",
    "log_format": "LOG_FORMAT",
    "metrics_host": "METRICS_HOST",
    "metrics_port": "METRICS_PORT",
    "stream_replicas": "STREAM_REPLICAS",
    "nats_user": "NATS_USER",
    "nats_password": "NATS_PASSWORD",
}
_INTS = {"metrics_port", "stream_replicas"}


def _coerce(name: str, value: object) -> object:
    if name in _INTS and isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            var = _ENV_VARS[name]
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} / {var}: {value!r} is not a whole number; use digits only, e.g. 9464"
            ) from None
    if name in ("log_level", "log_format") and isinstance(value, str):
        return value.lower()
    return value
