"""The health service's ``--egress-*`` flags and the settings they make; each that cannot work
fails at start-up, naming the flag (docs/decisions/0111-verified-egress.md)."""

from __future__ import annotations

from pathlib import Path

import click

from services.health.egress import (
    DEFAULT_ECHO_URL,
    DEFAULT_INTERVAL,
    DEFAULT_MAX_REPLACEMENTS,
    EgressSettings,
)
from services.health.geoip import GeoIpError, open_lookup
from services.health.probe_client import CheckUrl, provider_check_urls
from services.runtime.egress_policy import POLICY_OPTIONS, policy_from
from services.runtime.errors import ConfigError
from services.runtime.options import env_option

MAX_INTERVAL = 7 * 24 * 3600.0
MAX_REPLACEMENTS = 100


def egress_settings(
    *,
    egress_echo_url: str = DEFAULT_ECHO_URL,
    provider_egress_echo_url: tuple[str, ...] = (),
    egress_interval: float = DEFAULT_INTERVAL,
    geoip_db: tuple[Path, ...] = (),
    egress_max_replacements: int = DEFAULT_MAX_REPLACEMENTS,
    egress_country_attribute: str = "",
    egress_required: bool = False,
    unique_egress: bool = False,
) -> tuple[EgressSettings | None, tuple[Path, ...]]:
    """The checks' settings (None: ``--egress-interval 0``, no checks) and the databases."""
    try:
        CheckUrl.parse(egress_echo_url)
    except ValueError as exc:
        raise ConfigError(f"--egress-echo-url / EGRESS_ECHO_URL: {exc}") from exc
    per_provider = provider_check_urls(provider_egress_echo_url, "--provider-egress-echo-url")
    if geoip_db:
        try:
            open_lookup(geoip_db)  # a file that cannot be read fails now, not at the first check
        except GeoIpError as exc:
            raise ConfigError(str(exc)) from exc
    policy = policy_from(egress_country_attribute, egress_required, unique_egress)
    if not egress_interval:
        return None, geoip_db
    settings = EgressSettings(
        echo_url=egress_echo_url,
        provider_echo_urls=per_provider,
        interval=egress_interval,
        policy=policy,
        max_replacements=egress_max_replacements,
    )
    return settings, geoip_db


EGRESS_OPTIONS: tuple[click.Option, ...] = (
    *POLICY_OPTIONS,
    env_option(
        "--egress-echo-url",
        default=DEFAULT_ECHO_URL,
        show_default=True,
        help="URL fetched through each proxy to learn the public address a site sees: it must "
        'answer the caller\'s address, as plain text or JSON {"ip": ...}; '
        "spec.egressCheck.url wins.",
    ),
    click.Option(
        ["--provider-egress-echo-url"],
        multiple=True,
        metavar="NAME=URL",
        help="For the proxies of provider instance NAME, fetch URL instead of "
        "--egress-echo-url (repeatable).",
    ),
    env_option(
        "--egress-interval",
        type=click.FloatRange(min=0, max=MAX_INTERVAL),
        default=DEFAULT_INTERVAL,
        show_default=True,
        help="Seconds between egress checks of one proxy (it is also checked once Ready and "
        "after each replacement); 0 turns the checks off.",
    ),
    env_option(
        "--geoip-db",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        multiple=True,
        help="A MaxMind database (GeoLite2 or commercial Country, City or ASN; repeatable) to "
        "place egress addresses with; without one, the data geoip2fast ships (country and AS "
        "organisation, no AS numbers).",
    ),
    env_option(
        "--egress-max-replacements",
        type=click.IntRange(min=0, max=MAX_REPLACEMENTS),
        default=DEFAULT_MAX_REPLACEMENTS,
        show_default=True,
        help="Replacements of one proxy whose egress does not match (spec.egress.onMismatch: "
        "replace) before it is left out of leasing until its spec changes.",
    ),
)
