"""Where a proxy lets its holder go: the destination rules every provider's Squid runs (D134).

A holder of a lease may send anything to its proxy, so the proxy, not the crawler, decides which
destinations exist. Squid's ``dst`` ACLs match the destination's *resolved* address, so one rule
covers every spelling of it (a name pointing inside, ``[::ffff:127.0.0.1]``, decimal or octal
IPv4, ``0``): the request is refused before Squid opens any connection. Refused always, whatever
a provider entry lists: link-local (every cloud's metadata service lives there, or at
``fd00:ec2::254``) and the metadata services' names. Refused unless an entry's
``allowedTargets`` lists them: loopback, private, shared (CGNAT) and other non-public ranges,
and ``CONNECT`` to any port but 443. The local provider, whose proxies run beside the sites a
developer tests with, also lets plain HTTP reach loopback on any port.

Pure: the rules are text, and ``allowedTargets`` is checked here so that every provider's block
says the same thing about the same mistake
(docs/decisions/0134-where-a-proxy-lets-its-holder-go.md).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

import msgspec

LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
METADATA_ADDRESSES = ("169.254.169.254", "fd00:ec2::254")
"""GCE, AWS, Azure, DigitalOcean, Hetzner and OpenStack serve metadata at 169.254.169.254;
AWS's Nitro instances also at fd00:ec2::254 (inside fc00::/7, so refused with it, but named
here too: no ``allowedTargets`` may open it)."""
METADATA_NAMES = ("metadata.google.internal", "metadata")
"""Names that reach a metadata service through the VM's resolver (GCE's search path makes the
bare ``metadata`` resolve). Their addresses are refused anyway; the names are refused too, so no
answer depends on what a resolver says."""
LOOPBACK = ("127.0.0.0/8", "::1")
INSIDE = (
    "0.0.0.0/8",  # "this network": 0 and 0.0.0.0 reach this host
    "10.0.0.0/8",
    "100.64.0.0/10",  # shared address space (CGNAT)
    "127.0.0.0/8",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",  # reserved, and the broadcast address
    "::/128",
    "::1",
    "64:ff9b::/96",  # NAT64: an IPv4 address, inside ones included, in IPv6 clothing
    "fc00::/7",  # unique local (ULA)
    "fec0::/10",
    "ff00::/8",
)
"""Ranges no public site lives in: the proxy's own host and network, the provider's internal
networks, and what cannot be a destination at all. IPv4-mapped IPv6 addresses need no entry:
Squid keeps every IPv4 address in mapped form and matches it against these."""
NEVER = tuple(ipaddress.ip_network(n) for n in (*LINK_LOCAL, "fd00:ec2::254/128"))
CONNECT_PORTS = (443,)
MAX_TARGETS = 64
"""More than an intranet crawl lists; each entry is three ACLs in every Squid."""

_RANGE = re.compile(r"^([0-9]{1,5})-([0-9]{1,5})\Z")


class AllowedTarget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``allowedTargets`` entry: the proxies may reach ``cidr`` on ``ports`` (plain HTTP and
    CONNECT alike), although the range is not public."""

    cidr: str
    ports: tuple[int | str, ...] = ()
    """Port numbers, or ranges written ``"8000-8099"``."""


def targets_problem(targets: Sequence[AllowedTarget], field: str = "allowedTargets") -> str:
    """The first problem with ``targets``, naming the entry and the fix; ``""`` if none."""
    if len(targets) > MAX_TARGETS:
        return f"{field} has {len(targets)} entries; at most {MAX_TARGETS}: merge ranges"
    for index, target in enumerate(targets):
        where = f"{field}[{index}]"
        problem = _cidr_problem(target.cidr, f"{where}.cidr") or _ports_problem(
            target.ports, f"{where}.ports"
        )
        if problem:
            return problem
    return ""


def _cidr_problem(cidr: str, where: str) -> str:
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        return (
            f"{where}: {cidr!r} is not a CIDR ({exc}); write the network of the range the "
            "crawl needs, e.g. 10.20.0.0/16 or fd12:3456::/48"
        )
    if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(
        ipaddress.IPv6Network("::ffff:0:0/96")
    ):
        return f"{where}: {cidr!r} is an IPv4-mapped range; write the IPv4 range itself"
    for never in NEVER:
        if network.version == never.version and network.overlaps(never):
            return (
                f"{where}: {cidr!r} overlaps {never}, which no proxy may reach (link-local "
                "addresses and the clouds' metadata services); list a range outside it"
            )
    return ""


def _ports_problem(ports: Sequence[int | str], where: str) -> str:
    if not ports:
        return f"{where} is empty; list the ports the crawl needs, e.g. [80, 443, 8000-8099]"
    for port in ports:
        if isinstance(port, bool):
            return f"{where}: {port!r} is not a port; write a number from 1 to 65535"
        if isinstance(port, int):
            if not 1 <= port <= 65535:
                return f"{where}: {port} is not a port; write a number from 1 to 65535"
            continue
        match = _RANGE.match(port)
        low, high = (int(match[1]), int(match[2])) if match else (0, 0)
        if not match or not 1 <= low <= high <= 65535:
            return (
                f"{where}: {port!r} is not a port or a port range; write a number from 1 to "
                '65535 or a range such as "8000-8099" (low first)'
            )
    return ""


def target_lines(
    targets: Sequence[AllowedTarget] = (),
    *,
    loopback_http: bool = False,
    own_addresses_file: str = "",
) -> list[str]:
    """The ACLs and ``http_access deny`` rules, in order; they go after the lease rules and
    before any ``allow``. ``loopback_http``: plain HTTP to loopback on any port (the local
    provider); ``own_addresses_file``: a file of the host's own addresses, one a line (a VM's,
    written at each Squid start), refused whatever ``targets`` lists. ``targets`` must have
    passed ``targets_problem``."""
    lines = [
        f"acl egress_to_metadata_name dstdomain {' '.join(METADATA_NAMES)}",
        f"acl egress_to_link_local dst {' '.join(LINK_LOCAL)}",
        f"acl egress_to_metadata dst {' '.join(METADATA_ADDRESSES)}",
        f"acl egress_to_inside dst {' '.join(INSIDE)}",
        "acl egress_connect method CONNECT",
        f"acl egress_connect_ports port {' '.join(str(p) for p in CONNECT_PORTS)}",
    ]
    listed: list[str] = []
    for index, target in enumerate(targets, start=1):
        name = f"egress_target_{index}"
        network = ipaddress.ip_network(target.cidr, strict=True)
        lines += [
            f"acl {name}_net dst {network}",
            f"acl {name}_ports port {' '.join(str(p) for p in target.ports)}",
            f"acl {name} all-of {name}_net {name}_ports",
        ]
        listed.append(name)
    if listed:
        lines.append(f"acl egress_listed any-of {' '.join(listed)}")
    unless = " !egress_listed" if listed else ""
    lines += [
        "http_access deny egress_to_metadata_name",
        "http_access deny egress_to_link_local",
        "http_access deny egress_to_metadata",
    ]
    if own_addresses_file:
        lines += [
            f'acl egress_to_own_host dst "{own_addresses_file}"',
            "http_access deny egress_to_own_host",
        ]
    lines.append(f"http_access deny egress_connect !egress_connect_ports{unless}")
    if loopback_http:
        lines += [
            f"acl egress_to_loopback dst {' '.join(LOOPBACK)}",
            f"http_access deny egress_to_inside{unless} !egress_to_loopback",
        ]
    else:
        lines.append(f"http_access deny egress_to_inside{unless}")
    return lines


def header_lines() -> list[str]:
    """A proxy tells a site nothing about itself: no ``Via``, no ``X-Forwarded-For``, no
    ``Cache-Control: max-age`` of Squid's own. Squid gives a request's ``Cache-Control`` a
    ``max-age`` (``refresh_pattern``'s maximum, 259200 by default) unless the client's already
    has one or says ``no-cache``, and no setting stops it; the header mangling runs after it is
    added, so a ``Cache-Control`` is forwarded only when the client's is one Squid leaves alone.
    A client's ``Cache-Control`` without either (``no-store`` alone, say) is removed rather
    than sent with Squid's addition (D134)."""
    return [
        "via off",
        "forwarded_for delete",
        f"acl egress_client_cache_control req_header Cache-Control {_KEPT_CACHE_CONTROL}",
        "request_header_access Cache-Control deny !egress_client_cache_control",
    ]


_KEPT_CACHE_CONTROL = "(^|[[:space:],])(max-age|no-cache)([[:space:],=]|$)"
"""A client ``Cache-Control`` Squid forwards untouched: one naming max-age or no-cache, in lower
case as Squid parses them (POSIX
extended, no spaces: Squid splits an ACL's values at whitespace)."""
