"""The health service's ``--egress-*`` settings and what they make; each that cannot work
fails at start-up, naming the flag (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from services.health.egress import (
    DEFAULT_ECHO_URL,
    DEFAULT_INTERVAL,
    DEFAULT_MAX_REPLACEMENTS,
    EgressSettings,
)
from services.health.geoip import GeoIpError, open_lookup
from services.health.probe_client import CheckUrl, provider_check_urls
from services.runtime.settings.egress import PolicySettings
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.spec import setting

MAX_INTERVAL = 7 * 24 * 3600.0
MAX_REPLACEMENTS = 100


class EgressFlags(msgspec.Struct, frozen=True, kw_only=True):
    """The egress checks' part of the health service's settings."""

    policy: PolicySettings = msgspec.field(default_factory=PolicySettings)
    egress_echo_url: Annotated[
        str,
        setting(
            "URL fetched through each proxy to learn the public address a site sees: it must "
            'answer the caller\'s address, as plain text or JSON {"ip": ...}; '
            "spec.egressCheck.url wins."
        ),
    ] = DEFAULT_ECHO_URL
    provider_egress_echo_url: Annotated[
        tuple[str, ...],
        setting(
            "For the proxies of provider instance NAME, fetch URL instead of "
            "--egress-echo-url (repeatable).",
            env=None,
            metavar="NAME=URL",
            show_default=False,
        ),
    ] = ()
    egress_interval: Annotated[
        float,
        setting(
            "Seconds between egress checks of one proxy (it is also checked once Ready and "
            "after each replacement); 0 turns the checks off.",
            ge=0,
            le=MAX_INTERVAL,
        ),
    ] = DEFAULT_INTERVAL
    geoip_db: Annotated[
        tuple[Path, ...],
        setting(
            "A MaxMind database (GeoLite2 or commercial Country, City or ASN; repeatable) to "
            "place egress addresses with; without one, the data geoip2fast ships (country and AS "
            "organisation, no AS numbers).",
            path="file",
            exists=True,
            show_default=False,
        ),
    ] = ()
    egress_max_replacements: Annotated[
        int,
        setting(
            "Replacements of one proxy whose egress does not match (spec.egress.onMismatch: "
            "replace) before it is left out of leasing until its spec changes.",
            ge=0,
            le=MAX_REPLACEMENTS,
        ),
    ] = DEFAULT_MAX_REPLACEMENTS


def egress_settings(flags: EgressFlags) -> tuple[EgressSettings | None, tuple[Path, ...]]:
    """The checks' settings (None: ``--egress-interval 0``, no checks) and the databases."""
    try:
        CheckUrl.parse(flags.egress_echo_url)
    except ValueError as exc:
        raise ConfigError(f"--egress-echo-url / EGRESS_ECHO_URL: {exc}") from exc
    per_provider = provider_check_urls(flags.provider_egress_echo_url, "--provider-egress-echo-url")
    if flags.geoip_db:
        try:
            # A file that cannot be read fails now, not at the first check.
            open_lookup(flags.geoip_db)
        except GeoIpError as exc:
            raise ConfigError(str(exc)) from exc
    policy = flags.policy.policy()
    if not flags.egress_interval:
        return None, flags.geoip_db
    settings = EgressSettings(
        echo_url=flags.egress_echo_url,
        provider_echo_urls=per_provider,
        interval=flags.egress_interval,
        policy=policy,
        max_replacements=flags.egress_max_replacements,
    )
    return settings, flags.geoip_db
