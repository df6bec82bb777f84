"""Settings shared by every service, from flags and the environment.

The CLI parses each setting from its flag or its variable (D74); a setting a command has no
flag for is an ``EnvSetting`` of that command (``services.cli.common.env_settings``), so every
command reads and checks the same variables. ``Settings.from_options`` then checks the values,
here only: invalid settings fail at start-up with the flag and variable named and the fix
stated, since a service that starts with a typo in its NATS URL would otherwise look healthy
while doing nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import msgspec

from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import field_named, setting

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("console", "json")


@dataclass(frozen=True, slots=True)
class Credentials:
    """A NATS user and password. The password stays out of ``repr``, so a logged object or a
    traceback never shows it."""

    user: str
    password: str = field(repr=False)


def split_urls(text: str) -> list[str]:
    """The URLs of a comma-separated list (``--nats-url nats://a:4222,nats://b:4222``, the
    servers of one cluster), stripped, empty items dropped. Lenient: ``Settings.validate``
    rejects what this lets through (empty items, duplicates, mixed schemes)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def redact_url(url: str) -> str:
    """``url`` (or each URL of a comma-separated list) with any password replaced by ``***``:
    URLs are logged and printed, and a user may have put ``user:password@`` into one (nats-py
    accepts it). A lone ``name@`` is a token to nats-py, so it goes too."""
    if "," in url:
        return ",".join(_redact_one(item.strip()) for item in url.split(","))
    return _redact_one(url)


def _redact_one(url: str) -> str:
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
    """Whether ``url``, or any URL of a comma-separated list, carries a user."""
    return any(_has_user(item) for item in split_urls(url))


def _has_user(url: str) -> bool:
    try:
        return urlsplit(url).username is not None
    except ValueError:
        return False


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def check_nats_urls(text: str, setting: str = "--nats-url / NATS_URL") -> list[str]:
    """The URLs of ``text``, one server or a comma-separated list of a cluster's servers;
    ``ConfigError`` naming the bad item (its password redacted) and the fix otherwise."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise ConfigError(f"{setting} is empty; use e.g. nats://127.0.0.1:4222")
    example = "nats://10.0.0.1:4222,nats://10.0.0.2:4222"
    if any(not item for item in items):
        raise ConfigError(
            f"{setting}: {redact_url(text)!r} has an empty item; separate the URLs with single "
            f"commas, e.g. {example}"
        )
    for item in items:
        try:
            url = urlsplit(item)
            valid = url.scheme in NATS_SCHEMES and bool(url.hostname) and url.port != 0
        except ValueError:
            valid = False
        if not valid:
            where = " in the list" if len(items) > 1 else ""
            raise ConfigError(
                f"{setting}: {_redact_one(item)!r}{where} is not a NATS URL; "
                f"use e.g. nats://127.0.0.1:4222 (a cluster: {example})"
            )
    seen: set[tuple[str, int]] = set()
    for item in items:
        url = urlsplit(item)
        key = ((url.hostname or "").lower(), url.port or 4222)
        if key in seen:
            raise ConfigError(
                f"{setting}: {_redact_one(item)!r} names the same server twice; "
                "list each server of the cluster once"
            )
        seen.add(key)
    schemes = sorted({urlsplit(item).scheme for item in items})
    if len(schemes) > 1:
        raise ConfigError(
            f"{setting}: the URLs mix the schemes {', '.join(schemes)}; use one scheme for every "
            "server (a client must not fall back to a plain connection, and nats-py cannot mix "
            "websocket and TCP)"
        )
    with_user = [item for item in items if _has_user(item)]
    if with_user and len(with_user) != len(items):
        raise ConfigError(
            f"{setting}: {_redact_one(with_user[0])!r} carries a user and other URLs do not; put "
            "user:password in every URL, or in none and set NATS_USER and NATS_PASSWORD"
        )
    return items


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """What every service and command shares: where NATS is and how to log in, logging, the
    metrics endpoint (docs/decisions/0148-one-settings-struct-per-service.md). Each command
    has flags for some (``--nats-url``; ``run`` and ``up`` ``--metrics-port``) and reads the
    rest from their variables only."""

    internal: ClassVar[frozenset[str]] = frozenset({"service_name"})
    """Fields the command itself sets, never an operator: no flag, no variable."""

    nats_url: Annotated[
        str,
        setting(
            f"NATS server to use, {DEFAULT_NATS_URL} by default; a cluster's servers as a "
            "comma-separated list (nats://a:4222,nats://b:4222,nats://c:4222). Log in with "
            "nats://user:password@host:port or NATS_USER and NATS_PASSWORD; next to `up`, its "
            "embedded server's credentials are used.",
            metavar="URL",
            show_default=False,
        ),
    ] = DEFAULT_NATS_URL
    log_level: Annotated[
        str, setting("Least severe log level written (logs go to standard error).")
    ] = "info"
    log_format: Annotated[str, setting("console for people, json for collectors.")] = "console"
    metrics_host: Annotated[
        str, setting("Address the /metrics endpoint listens on; 0.0.0.0 in a container.")
    ] = "127.0.0.1"
    metrics_port: Annotated[
        int, setting("Port of the Prometheus /metrics endpoint; 0 turns it off.", ge=0, le=65535)
    ] = 0
    stream_replicas: Annotated[
        int, setting("Copies of each stream: 1 on one server, 3 (or 5) in a cluster.")
    ] = 1
    service_name: str = "egress-proxies"
    nats_user: Annotated[str, setting("The NATS user to log in as; NATS_PASSWORD with it.")] = ""
    nats_password: Annotated[str, setting("The NATS user's password.")] = ""

    def __repr__(self) -> str:
        """Without the password, so a logged object or a traceback never shows it."""
        shown = {name: getattr(self, name) for name in self.__struct_fields__}
        shown["nats_password"] = "***" if self.nats_password else ""
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def nats_urls(self) -> list[str]:
        """The servers of ``nats_url``: one, or the comma-separated servers of a cluster."""
        return split_urls(self.nats_url)

    @property
    def credentials(self) -> Credentials | None:
        """From ``NATS_USER``/``NATS_PASSWORD``; None when they are unset, so a ``user:password``
        in the URL, or the local credentials of ``egress-proxies up``, apply instead."""
        if not self.nats_user:
            return None
        return Credentials(self.nats_user, self.nats_password)

    @classmethod
    def from_options(cls, **options: object) -> Settings:
        """From the values click parsed, flag over variable; None (neither is set, or the
        command has no such option) keeps the default. Raises ``ConfigError`` for a value no
        service can run with."""
        unknown = set(options) - set(cls.__struct_fields__)
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        given: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        # Checked by ``validate``, whose messages say what to use, rather than by msgspec's.
        settings = cls(**given)
        settings.validate()
        return settings

    def validate(self) -> None:
        check_nats_urls(self.nats_url, _named("nats_url"))
        _check_pair(self.nats_user, self.nats_password)
        if self.nats_user and url_has_credentials(self.nats_url):
            raise ConfigError(
                f"{_named('nats_url')} carries a user, and NATS_USER is set too: use one of them"
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"{_named('log_level')}: {self.log_level!r}; use one of {', '.join(LOG_LEVELS)}"
            )
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(
                f"{_named('log_format')}: {self.log_format!r}; use one of {', '.join(LOG_FORMATS)}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"{_named('metrics_port')}: {self.metrics_port} is not a port; "
                "use 1-65535, or 0 to turn the metrics endpoint off"
            )
        if self.stream_replicas not in (1, 3, 5):
            raise ConfigError(
                f"{_named('stream_replicas')}: {self.stream_replicas}; "
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


def _named(name: str) -> str:
    """How a message names a setting: its flag and its variable, ``--metrics-port /
    METRICS_PORT``, as its field declares them."""
    return field_named(Settings, name).named
