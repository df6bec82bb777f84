"""The settings every cloud VM provider block has, validated when the providers config is read.

Each cloud's block (``aws:``, ``digitalocean:``, ``hetzner:``) subclasses ``CloudSettings`` and
adds its own fields; ``check_cloud_settings`` names the field and the fix of the first problem.
The functions after it are the rules more than one block applies to a field of its own (a list of
places, SSH keys, a token file, a token-bearing endpoint), so one rule reads the same everywhere.
``allowedClients`` has no default: the firewall opens the proxy port to these ranges only, so an
operator says who the crawlers (and the health prober) are, and a world-open proxy is written
out as ``0.0.0.0/0`` on purpose, never assumed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Annotated
from urllib.parse import urlparse

import msgspec

from services.providers.pure.targets import AllowedTarget, targets_problem

WORLD = frozenset({"0.0.0.0/0", "::/0"})
MAX_CLIENT_RANGES = 60
"""Fewer than any of the three clouds allows in one firewall rule set (AWS: 60 rules per
security group by default), so a valid config is one the cloud accepts."""


class CloudSettings(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    allowed_clients: tuple[str, ...] = ()
    """CIDRs that may reach the proxy port: the crawlers' and the health prober's addresses."""
    proxy_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 3128
    endpoint_url: str = ""
    """The cloud API's base URL: an AWS-compatible endpoint, a regional one, or a test fake."""
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=600)] = 30.0
    install_squid: bool = True
    """Add the user-data part that installs and configures the egress Squid (Debian and Ubuntu
    images); false when the Proxy's own cloud-init installs it."""
    allowed_targets: tuple[AllowedTarget, ...] = ()
    """Non-public ranges and ports the proxies may reach, for an intranet crawl (D134)."""


def check_cloud_settings(settings: CloudSettings) -> str:
    """The first problem with the shared fields, or ``""``."""
    if not settings.allowed_clients:
        return (
            "allowedClients is required: the CIDRs of your crawlers and of the health prober, "
            "e.g. [203.0.113.0/24]; the firewall opens the proxy port to them only "
            "(0.0.0.0/0 opens it to the world, deliberately)"
        )
    if len(settings.allowed_clients) > MAX_CLIENT_RANGES:
        return (
            f"allowedClients has {len(settings.allowed_clients)} ranges; at most "
            f"{MAX_CLIENT_RANGES} fit in one firewall: merge them into larger ranges"
        )
    for cidr in settings.allowed_clients:
        try:
            ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            return f"allowedClients: {cidr!r} is not a CIDR ({exc}); use e.g. 203.0.113.0/24"
    problem = targets_problem(settings.allowed_targets)
    if problem:
        return problem
    if settings.endpoint_url:
        url = urlparse(settings.endpoint_url)
        if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
            return (
                f"endpointUrl {settings.endpoint_url!r}: use a base URL such as "
                "https://api.example.internal (no path), or leave it out for the cloud's own"
            )
    return ""


def client_networks(settings: CloudSettings) -> list[str]:
    """``allowedClients`` in canonical form, IPv4 first: what a firewall rule lists."""
    networks = [ipaddress.ip_network(cidr, strict=True) for cidr in settings.allowed_clients]
    networks.sort(key=lambda n: (n.version, n))
    return [str(n) for n in networks]


def shown(value: str, limit: int = 80) -> str:
    """A value quoted for a message, cut short: a pasted blob must not flood the error."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def count_problem(
    field: str, values: Sequence[str], limit: int, *, required: str = "", unit: str = "entries"
) -> str:
    """Too many values (a bound the cloud sets, or sanity); none when ``required`` says what to
    list instead."""
    if not values and required:
        return f"{field} is empty; {required}"
    if len(values) > limit:
        return f"{field} has {len(values)} {unit}; at most {limit}"
    return ""


def each_problem(field: str, values: Sequence[str], pattern: re.Pattern[str], what: str) -> str:
    """The first value ``pattern`` does not match: it ``is not {what}`` (the fix included)."""
    bad = next((value for value in values if not pattern.match(value)), None)
    return "" if bad is None else f"{field}: {shown(bad)} is not {what}"


def twice_problem(field: str, values: Sequence[str], noun: str) -> str:
    """A value listed twice: spreading hashes over the list, so it would get twice the share."""
    seen: set[str] = set()
    for value in values:
        if value in seen:
            return (
                f"{field}: {shown(value)} is listed twice; list each once (a list that lists "
                f"{noun} twice gives it twice the share of instances)"
            )
        seen.add(value)
    return ""


def places_problem(
    field: str,
    values: Sequence[str],
    limit: int,
    *,
    noun: str,
    pattern: re.Pattern[str] | None = None,
    what: str = "",
    required: str = "",
) -> str:
    """A list of regions, zones, locations or subnets the instances are spread over: at most
    ``limit``, each matching ``pattern`` (when given; it ``is not {what}`` otherwise), none
    twice; empty only when nothing is ``required``."""
    return (
        count_problem(field, values, limit, required=required)
        or (each_problem(field, values, pattern, what) if pattern is not None else "")
        or twice_problem(field, values, noun)
    )


def ssh_keys_problem(keys: Sequence[str], limit: int, pattern: re.Pattern[str], what: str) -> str:
    """``sshKeys``: keys in the cloud's project for a person to log in; at most ``limit``."""
    return count_problem("sshKeys", keys, limit, unit="keys") or each_problem(
        "sshKeys", keys, pattern, what
    )


def token_api_problem(token_file: str, endpoint_url: str, *, example: str, variable: str) -> str:
    """A cloud whose API takes a bearer token (DigitalOcean, Hetzner): where the token is read
    from, and where it may be sent."""
    return token_file_problem(token_file, example, variable) or plain_http_problem(endpoint_url)


def token_file_problem(path: str, example: str, variable: str) -> str:
    """``tokenFile``: an absolute path (a mounted Secret) or nothing, the token then being in
    the environment ``variable``."""
    if not path or (path.startswith("/") and "\0" not in path):
        return ""
    return (
        f"tokenFile {shown(path)}: use an absolute path, e.g. {example} (a mounted Secret), or "
        f"leave it out to use {variable}"
    )


def loopback_host(host: str) -> bool:
    """Whether ``host`` (a URL's host name) is this machine."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_http_problem(endpoint: str) -> str:
    """An API token travels in every request's header: over plain http only to this machine (a
    local test fake), never across a network."""
    url = urlparse(endpoint)
    if url.scheme != "http" or loopback_host(url.hostname or ""):
        return ""
    return (
        f"endpointUrl {shown(endpoint)}: plain http would send the API token unencrypted; use "
        "https, or http only to a loopback address (a local test fake, e.g. http://127.0.0.1:8089)"
    )
