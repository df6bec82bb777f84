"""Pure translations between our contract and DigitalOcean: tags, states, ids, the firewall.

DigitalOcean has no key/value labels, only tags: strings of letters, digits, ``:``, ``-`` and
``_``, at most 255 characters, "case stable" (the first spelling is canonical). So each of our
labels is one tag, ``<prefix>:<value>``, and a droplet's tags are read back into the same
``egress-proxies/...`` labels every provider reports. A value that cannot be part of a tag is
refused, never rewritten: a changed owner uid would make the droplet the orphan of a proxy that
does not exist.

The firewall's rules are computed and compared here too, so "does it need a PUT" is a pure
question with table tests.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from events.schemas import InstanceState
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    NAME_LABEL,
    NAMESPACE_LABEL,
    OWNER_LABEL,
)
from services.providers.pure.identity import Grammar, identity_labels

PROVIDER_LABEL = "egress-proxies/provider"
SPEC_HASH_LABEL = "egress-proxies/spec-hash"

MANAGED_TAG = "egress-proxies-managed"
PROVIDER_PREFIX = "egress-proxies-provider:"
OWNER_PREFIX = "egress-proxies-owner:"
SPEC_PREFIX = "egress-proxies-spec:"
NAMESPACE_PREFIX = "egress-proxies-namespace:"
NAME_PREFIX = "egress-proxies-name:"
_PREFIXES = {
    OWNER_PREFIX: OWNER_LABEL,
    PROVIDER_PREFIX: PROVIDER_LABEL,
    SPEC_PREFIX: SPEC_HASH_LABEL,
    NAMESPACE_PREFIX: NAMESPACE_LABEL,
    NAME_PREFIX: NAME_LABEL,
}

MAX_TAG = 255
TAG = re.compile(r"^[A-Za-z0-9:_-]{1,255}\Z")
_DROPLET_ID = re.compile(r"^[1-9][0-9]{0,17}\Z")
_FIREWALL_ID = re.compile(
    r"^firewalls/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\Z"
)
DROPLET_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,253}[A-Za-z0-9])?\Z")
MAX_USER_DATA = 64 * 1024
"""DigitalOcean's limit on a droplet's user data, in bytes."""

WORLD = ("0.0.0.0/0", "::/0")
ALL_PORTS = frozenset({"", "0", "all", "1-65535"})
"""How DigitalOcean may spell "every port" in a rule it returns."""
ICMP_PORTS = "0"
"""What an icmp rule's required ``ports`` holds: icmp has no ports."""

_STATES = {"new": InstanceState.PENDING, "off": InstanceState.STOPPED}


class TagError(ValueError):
    """A value that cannot be a tag; the message names the field."""


# ----------------------------------------------------------------------------- tags


def provider_tag(provider_name: str) -> str:
    """Entry names are 1-63 letters, digits, '_' or '-' (valid tag characters); lowercased, as
    DigitalOcean's tag lookups depend on the tag's first spelling."""
    return PROVIDER_PREFIX + provider_name.lower()


def identity_tags(namespace: str, proxy_name: str) -> list[str]:
    """The proxy's namespace and name as tags, for the console
    (``services.providers.pure.identity``): unlike the uid, fitted to the tag grammar rather
    than refused, and lowercased, as a tag's first spelling is the one every droplet shows."""
    prefixes = {NAMESPACE_LABEL: NAMESPACE_PREFIX, NAME_LABEL: NAME_PREFIX}
    longest = MAX_TAG - max(len(prefix) for prefix in prefixes.values())
    grammar = Grammar("a-z0-9:_-", longest, lowercase=True)
    return [
        prefixes[label] + value
        for label, value in identity_labels(namespace, proxy_name, grammar).items()
    ]


def droplet_tags(
    provider_name: str,
    owner_uid: str,
    spec_hash: str,
    *,
    namespace: str = "",
    proxy_name: str = "",
) -> list[str]:
    """The tags a droplet is created with; TagError names a value no tag can carry."""
    tags = [MANAGED_TAG, provider_tag(provider_name), *identity_tags(namespace, proxy_name)]
    for field, prefix, value in (
        ("the proxy uid (owner)", OWNER_PREFIX, owner_uid),
        ("the spec hash", SPEC_PREFIX, spec_hash),
    ):
        if not value and prefix == SPEC_PREFIX:
            continue
        tag = prefix + value
        if not value or not TAG.match(tag):
            raise TagError(
                f"{field} {value!r} cannot be a DigitalOcean tag ({prefix}<value>: letters, "
                f"digits, ':', '-' and '_', at most {MAX_TAG - len(prefix)} characters)"
            )
        tags.append(tag)
    return tags


def labels_from_tags(tags: Iterable[str]) -> dict[str, str]:
    """Our labels from a droplet's tags. A label whose tag appears twice with different values
    (someone tagged by hand) is left out: an ambiguous owner is no owner, and GC judges nothing
    without one."""
    labels: dict[str, str] = {}
    ambiguous: set[str] = set()
    for tag in tags:
        if tag == MANAGED_TAG:
            labels[MANAGED_LABEL] = "true"
            continue
        for prefix, label in _PREFIXES.items():
            if tag.startswith(prefix):
                value = tag[len(prefix) :]
                if labels.get(label, value) != value:
                    ambiguous.add(label)
                labels[label] = value
    for label in ambiguous:
        del labels[label]
    return labels


def is_managed_by(tags: Iterable[str], provider_name: str) -> bool:
    wanted = provider_tag(provider_name)
    found = set(tags)
    return MANAGED_TAG in found and wanted in found


# ----------------------------------------------------------------------------- droplets


def parse_droplet_id(value: str) -> int | None:
    """The droplet id of a provider id, or None for an id this provider never issues."""
    return int(value) if _DROPLET_ID.match(value) else None


def parse_firewall_id(value: str) -> str | None:
    """The firewall id of a leftover's provider id (``firewalls/<uuid>``), or None."""
    match = _FIREWALL_ID.match(value)
    return match.group(1) if match else None


def firewall_leftover_id(firewall_id: str) -> str:
    return f"firewalls/{firewall_id}"


def public_ipv4(droplet: Mapping[str, Any]) -> str:
    networks = droplet.get("networks")
    v4 = networks.get("v4") if isinstance(networks, Mapping) else None
    for network in v4 if isinstance(v4, list) else []:
        if isinstance(network, Mapping) and network.get("type") == "public":
            address = network.get("ip_address")
            if isinstance(address, str) and address:
                return address
    return ""


def state_of(status: str, ip: str) -> InstanceState | None:
    """None: gone (``archive`` is a destroyed droplet DigitalOcean still remembers). Active
    counts as Running only with a public IPv4 address: no address, no proxy URL."""
    if status == "archive":
        return None
    if status == "active":
        return InstanceState.RUNNING if ip else InstanceState.PENDING
    return _STATES.get(status, InstanceState.UNKNOWN)


def parse_timestamp(value: object) -> datetime:
    """DigitalOcean's ISO 8601 ``created_at`` (``2020-07-21T18:37:44Z``) in UTC; the epoch when
    missing or unreadable, so something whose age cannot be told counts as old."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
    return datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Droplet:
    """The fields of a droplet the provider reads, tolerant of missing ones."""

    id: int
    name: str
    status: str
    ip: str
    created_at: datetime
    tags: tuple[str, ...]

    @property
    def state(self) -> InstanceState | None:
        return state_of(self.status, self.ip)

    def labels(self) -> dict[str, str]:
        labels = labels_from_tags(self.tags)
        labels[CREATED_AT_LABEL] = self.created_at.isoformat()
        return labels


def droplet_of(raw: Mapping[str, Any]) -> Droplet | None:
    """None for an answer without a numeric id (not a droplet)."""
    droplet_id = raw.get("id")
    if isinstance(droplet_id, bool) or not isinstance(droplet_id, int) or droplet_id <= 0:
        return None
    tags = raw.get("tags")
    return Droplet(
        id=droplet_id,
        name=str(raw.get("name") or ""),
        status=str(raw.get("status") or ""),
        ip=public_ipv4(raw),
        created_at=parse_timestamp(raw.get("created_at")),
        tags=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else (),
    )


def next_page(answer: Mapping[str, Any]) -> bool:
    """Whether a listing answer says there is a page after this one."""
    links = answer.get("links")
    pages = links.get("pages") if isinstance(links, Mapping) else None
    return isinstance(pages, Mapping) and bool(pages.get("next"))


# ----------------------------------------------------------------------------- firewall


def firewall_rules(port: int, networks: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Inbound: tcp ``port`` from ``networks`` only. Outbound: everything, to everywhere: a
    DigitalOcean firewall blocks all outbound traffic it has no rule for, and an egress proxy
    must reach any site (tcp), resolve names (udp) and discover path MTUs (icmp).

    Every rule carries ``ports``: DigitalOcean's API reference marks it required for every
    protocol, and for icmp it is ``"0"``, the value the API answers for an icmp rule (D142)."""
    everywhere = {"addresses": list(WORLD)}
    return {
        "inbound_rules": [
            {"protocol": "tcp", "ports": str(port), "sources": {"addresses": list(networks)}}
        ],
        "outbound_rules": [
            {"protocol": "tcp", "ports": "1-65535", "destinations": everywhere},
            {"protocol": "udp", "ports": "1-65535", "destinations": everywhere},
            {"protocol": "icmp", "ports": ICMP_PORTS, "destinations": everywhere},
        ],
    }


def firewall_body(
    name: str, provider_name: str, port: int, networks: Sequence[str]
) -> dict[str, Any]:
    """The whole firewall: what a POST creates and a PUT puts right."""
    return {"name": name, **firewall_rules(port, networks), "tags": [provider_tag(provider_name)]}


Rule = tuple[str, str, frozenset[str]]


def _rules(raw: object, side: str) -> frozenset[Rule]:
    rules: set[Rule] = set()
    for rule in raw if isinstance(raw, list) else []:
        if not isinstance(rule, Mapping):
            continue
        protocol = str(rule.get("protocol") or "")
        ports = str(rule.get("ports") or "")
        ports = "all" if ports in ALL_PORTS or protocol == "icmp" else ports
        targets = rule.get(side)
        addresses = targets.get("addresses") if isinstance(targets, Mapping) else None
        others = (
            any(v for k, v in targets.items() if k != "addresses")
            if isinstance(targets, Mapping)
            else False
        )
        canonical = frozenset(_canonical(a) for a in addresses or [] if isinstance(a, str))
        if others:
            canonical |= {"<other targets>"}
        rules.add((protocol, ports, canonical))
    return frozenset(rules)


def _canonical(address: str) -> str:
    try:
        return str(ipaddress.ip_network(address, strict=False))
    except ValueError:
        return address


def firewall_differs(
    firewall: Mapping[str, Any], provider_name: str, port: int, networks: Sequence[str]
) -> list[str]:
    """What of ``firewall`` is not as this entry wants it (empty: nothing to put right)."""
    wanted = firewall_rules(port, networks)
    problems = []
    for key, side in (("inbound_rules", "sources"), ("outbound_rules", "destinations")):
        if _rules(firewall.get(key), side) != _rules(wanted[key], side):
            problems.append(key)
    tags = firewall.get("tags")
    if not isinstance(tags, list) or provider_tag(provider_name) not in tags:
        problems.append("tags")
    return problems
