"""Pure translations between our contract and Compute Engine: ids, labels, states, timestamps.

GCE label keys and values allow only lowercase letters, digits, ``_`` and ``-`` (keys start with a
letter, both at most 63 characters), so our ``egress-proxies/...`` keys are stored under fixed GCE
keys and mapped back on the way out: ``Instance.labels`` carries the same keys for every provider.
Underscores, not dashes, join the words, so a key is also a plain field name in an API filter.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

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

TO_GCP: dict[str, str] = {
    MANAGED_LABEL: "egress_proxies_managed",
    OWNER_LABEL: "egress_proxies_owner_uid",
    PROVIDER_LABEL: "egress_proxies_provider",
    SPEC_HASH_LABEL: "egress_proxies_spec_hash",
    NAMESPACE_LABEL: "egress_proxies_namespace",
    NAME_LABEL: "egress_proxies_name",
}
FROM_GCP: dict[str, str] = {gcp: ours for ours, gcp in TO_GCP.items()}

_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}\Z")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")
_PROVIDER_ID = re.compile(r"^zones/([a-z][-a-z0-9]{0,62})/instances/([a-z][-a-z0-9]{0,62})\Z")

_STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    # Being repaired by GCE after a host failure: it comes back by itself.
    "REPAIRING": InstanceState.PENDING,
    "STOPPING": InstanceState.STOPPED,
    "STOPPED": InstanceState.STOPPED,
    "SUSPENDING": InstanceState.STOPPED,
    "SUSPENDED": InstanceState.STOPPED,
    "TERMINATED": InstanceState.STOPPED,
}


def provider_id(zone: str, name: str) -> str:
    """Zone and name, not the placement: get and delete keep working after a placement edit."""
    return f"zones/{zone}/instances/{name}"


def parse_provider_id(value: str) -> tuple[str, str] | None:
    """``(zone, name)``, or None for an id this provider can never have issued."""
    match = _PROVIDER_ID.match(value)
    return (match.group(1), match.group(2)) if match else None


def state_of(status: str, external_ip: str) -> InstanceState:
    """RUNNING only counts once the ephemeral IP is attached: no address, no proxy URL."""
    if status == "RUNNING":
        return InstanceState.RUNNING if external_ip else InstanceState.PENDING
    return _STATES.get(status, InstanceState.UNKNOWN)


def label_value(value: str) -> str | None:
    """``value`` if GCE accepts it as a label value, else None (never a silent rewrite: a
    changed owner uid would make the instance an orphan of a proxy that does not exist)."""
    return value if _LABEL_VALUE.match(value) else None


LABEL_GRAMMAR = Grammar("a-z0-9_-", 63, lowercase=True)
"""GCE's label values: at most 63 lowercase letters, digits, '_' or '-' (international
letters too, which a fitted value does without)."""


def identity(namespace: str, proxy_name: str) -> dict[str, str]:
    """The proxy's namespace and name as GCE label values, for the console
    (``services.providers.pure.identity``): lowercased, a refused character made '-', cut at
    63."""
    return identity_labels(namespace, proxy_name, LABEL_GRAMMAR)


def provider_label_value(provider_name: str) -> str:
    """Provider names may use capitals and are at most 63 characters; lowercase them."""
    return provider_name.lower()


def labels_to_gcp(labels: dict[str, str]) -> dict[str, str]:
    return {TO_GCP.get(key, key): value for key, value in labels.items()}


def labels_from_gcp(labels: dict[str, str]) -> dict[str, str]:
    return {FROM_GCP.get(key, key): value for key, value in labels.items()}


def list_filter(provider_name: str) -> str:
    """The aggregatedList filter for "managed by this named provider" (one project may hold
    the instances of several, e.g. gcp-eu and gcp-us)."""
    managed = TO_GCP[MANAGED_LABEL]
    provider = TO_GCP[PROVIDER_LABEL]
    return (
        f'(labels.{managed} = "true") (labels.{provider} = "{provider_label_value(provider_name)}")'
    )


def parse_timestamp(value: str) -> datetime:
    """GCE's RFC 3339 ``creationTimestamp`` (with an offset, e.g. -07:00) in UTC."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def created_at_label(created_at: datetime) -> dict[str, str]:
    return {CREATED_AT_LABEL: created_at.isoformat()}


def short_name(url_or_name: str) -> str:
    """``zones/x`` or a full resource URL -> its last segment (``x``)."""
    return url_or_name.rstrip("/").rsplit("/", 1)[-1]
