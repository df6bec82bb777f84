"""Pure translations between our contract and Hetzner Cloud: ids, labels, states, places, the
firewall's rule.

Hetzner labels take Kubernetes-style keys (an optional DNS prefix, ``/``, a name of at most 63
characters), so the contract's ``egress-proxies/...`` keys are stored as they are: no mapping
back is needed. Values are at most 63 characters of letters, digits, ``.``, ``_`` and ``-``,
starting and ending with a letter or digit (or empty); a value that does not fit is refused,
never rewritten (a changed owner uid would make the server an orphan of a proxy that does not
exist).
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from events.schemas import InstanceState
from services.providers.base import CREATED_AT_LABEL, MANAGED_LABEL, OWNER_LABEL
from services.providers.cloud.pure.spread import spread
from services.providers.pure.identity import Grammar, identity_labels

PROVIDER_LABEL = "egress-proxies/provider"
SPEC_HASH_LABEL = "egress-proxies/spec-hash"

# Hetzner's label rules (the same as hcloud's own LabelValidator).
LABEL_KEY = re.compile(
    r"^([a-z0-9A-Z]((?:[\-_.]|[a-z0-9A-Z]){0,253}[a-z0-9A-Z])?/)?"
    r"[a-z0-9A-Z]((?:[\-_.]|[a-z0-9A-Z]){0,61}[a-z0-9A-Z])?\Z"
)
LABEL_VALUE = re.compile(r"^([a-z0-9A-Z]((?:[\-_.]|[a-z0-9A-Z]){0,61}[a-z0-9A-Z])?)?\Z")
# A server name is a hostname (RFC 1123); the reconciler's names are single labels.
SERVER_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
LOCATION = re.compile(r"^[a-z][a-z0-9-]{1,31}\Z")
SERVER_TYPE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")
IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_ID = re.compile(r"^[1-9][0-9]{0,17}\Z")
FIREWALL_ID_PREFIX = "firewalls/"
MAX_USER_DATA = 32 * 1024
"""Hetzner refuses user data over 32 KiB."""
RULE_DESCRIPTION = "egress-proxies: crawlers to Squid"

_STATES: dict[str, InstanceState] = {
    "initializing": InstanceState.PENDING,
    "starting": InstanceState.PENDING,
    # Moved to another host by Hetzner, or rebuilt from its image: it comes back by itself.
    "migrating": InstanceState.PENDING,
    "rebuilding": InstanceState.PENDING,
    "stopping": InstanceState.STOPPED,
    "off": InstanceState.STOPPED,
    "deleting": InstanceState.TERMINATING,
}


def provider_id(server_id: int) -> str:
    """The server's id: stable across renames, placements and config edits."""
    return str(server_id)


def parse_provider_id(value: str) -> int | None:
    """The server id, or None for an id this provider can never have issued."""
    return int(value) if _ID.match(value) else None


def firewall_leftover_id(firewall_id: int) -> str:
    return f"{FIREWALL_ID_PREFIX}{firewall_id}"


def parse_firewall_leftover_id(value: str) -> int | None:
    if not value.startswith(FIREWALL_ID_PREFIX):
        return None
    return parse_provider_id(value.removeprefix(FIREWALL_ID_PREFIX))


def state_of(status: str, address: str) -> InstanceState:
    """Running only once the server has a public address: no address, no proxy URL. A status
    Hetzner may add later reads as Unknown, which the reconciler looks at again."""
    if status == "running":
        return InstanceState.RUNNING if address else InstanceState.PENDING
    return _STATES.get(status, InstanceState.UNKNOWN)


def public_address(ipv4: str, ipv6_network: str) -> str:
    """The address a crawler reaches the proxy at: the public IPv4, else the first address of
    the server's IPv6 /64 (Hetzner configures ``<network>::1`` on the server)."""
    if ipv4:
        return ipv4
    if not ipv6_network:
        return ""
    try:
        network = ipaddress.IPv6Network(ipv6_network, strict=False)
    except ValueError:
        return ""
    return str(network.network_address + 1)


def parse_created(value: datetime | None) -> datetime:
    """Hetzner's ``created`` in UTC; a missing one is the epoch (so it counts as old)."""
    if value is None:
        return datetime(1970, 1, 1, tzinfo=UTC)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def with_created_label(labels: dict[str, str], created_at: datetime) -> dict[str, str]:
    return {**labels, CREATED_AT_LABEL: created_at.isoformat()}


def entry_labels(provider_name: str) -> dict[str, str]:
    """What marks a resource as made by this provider entry (servers and the firewall)."""
    return {MANAGED_LABEL: "true", PROVIDER_LABEL: provider_name}


LABEL_GRAMMAR = Grammar("A-Za-z0-9_.-", 63, alphanumeric_ends=True)
"""Hetzner's label values: at most 63 letters, digits, '.', '_' or '-', starting and ending
with a letter or digit."""


def server_labels(
    provider_name: str,
    owner_uid: str,
    spec_hash: str,
    *,
    namespace: str = "",
    proxy_name: str = "",
) -> dict[str, str]:
    """The server's labels; the proxy's namespace and name fitted to Hetzner's grammar, for the
    console (``services.providers.pure.identity``)."""
    labels = {**entry_labels(provider_name), OWNER_LABEL: owner_uid}
    if spec_hash:
        labels[SPEC_HASH_LABEL] = spec_hash[:63]
    return labels | identity_labels(namespace, proxy_name, LABEL_GRAMMAR)


def bad_label(labels: dict[str, str]) -> tuple[str, str] | None:
    """The first key/value Hetzner would refuse, or None."""
    for key, value in labels.items():
        if not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
            return key, value
    return None


def is_entrys(labels: dict[str, str] | None, provider_name: str) -> bool:
    """Whether a resource carries this entry's marks (a same-named one of someone else's does
    not)."""
    found = labels or {}
    return all(found.get(k) == v for k, v in entry_labels(provider_name).items())


def label_selector(provider_name: str) -> str:
    """Hetzner's ``label_selector`` for "managed by this named provider entry": one project may
    hold the servers of several (hetzner-eu, hetzner-us)."""
    return ",".join(f"{k}={v}" for k, v in entry_labels(provider_name).items())


@dataclass(frozen=True, slots=True)
class Place:
    location: str
    server_type: str
    image: str


def place(
    *,
    name: str,
    zone: str,
    region: str,
    machine_type: str,
    image: str,
    locations: Sequence[str],
    default_type: str,
    default_image: str,
) -> Place | str:
    """Where and what a server is, from ``spec.placement`` over the entry's defaults, or the
    problem naming the field. Hetzner has locations only (fsn1, ash): ``zone`` names one, and
    ``region`` may too when ``zone`` is empty; otherwise the name's stable hash picks one of the
    entry's ``locations``."""
    if zone and region and zone != region:
        return (
            f"spec.placement.zone {zone!r} and spec.placement.region {region!r} differ; Hetzner "
            "has locations only (e.g. fsn1): set one of them"
        )
    location = zone or region or spread(locations, name)
    field = "zone" if zone else "region"
    if not LOCATION.match(location):
        return f"spec.placement.{field} {location!r} is not a Hetzner location such as fsn1"
    server_type = machine_type or default_type
    if not SERVER_TYPE.match(server_type):
        return (
            f"spec.placement.machineType {server_type!r} is not a Hetzner server type such as cx23"
        )
    chosen_image = image or default_image
    if not IMAGE.match(chosen_image):
        return f"spec.placement.image {chosen_image!r} is not a Hetzner image name or id"
    return Place(location, server_type, chosen_image)


Rule = tuple[str, str, str, frozenset[str]]
"""(direction, protocol, port, source networks): what is compared of a firewall rule."""


def wanted_rules(port: int, networks: Iterable[str]) -> list[Rule]:
    return [("in", "tcp", str(port), frozenset(networks))]


def normalize_rule(
    direction: str, protocol: str, port: str | None, sources: Iterable[str] | None
) -> Rule:
    """Canonical networks, so ``10.0.0.0/8`` written either way compares equal; a source that
    is no network is kept as it is (and so never matches a wanted rule)."""
    canonical: set[str] = set()
    for source in sources or ():
        try:
            canonical.add(str(ipaddress.ip_network(source, strict=False)))
        except ValueError:
            canonical.add(source)
    return (direction, protocol, port or "", frozenset(canonical))


def rules_match(current: Iterable[Rule], wanted: Iterable[Rule]) -> bool:
    return Counter(current) == Counter(wanted)
