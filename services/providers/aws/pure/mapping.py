"""Pure translations between our contract and EC2: ids, tags, filters, states, instances.

EC2 tag keys may hold ``/`` and ``:`` (up to 128 characters; only the ``aws:`` prefix is
reserved), so our ``egress-proxies/...`` keys are the tag keys as they are: ``Instance.labels``
carries the same keys for every provider with no renaming. ``Name`` is EC2's display name and
the key a repeated create looks the instance up by.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from events.schemas import InstanceState
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    NAME_LABEL,
    NAMESPACE_LABEL,
    OWNER_LABEL,
    Instance,
)
from services.providers.pure.identity import Grammar, identity_labels

PROVIDER_LABEL = "egress-proxies/provider"
SPEC_HASH_LABEL = "egress-proxies/spec-hash"
NAME_TAG = "Name"
OUR_KEYS = (
    MANAGED_LABEL,
    OWNER_LABEL,
    PROVIDER_LABEL,
    SPEC_HASH_LABEL,
    CREATED_AT_LABEL,
    NAMESPACE_LABEL,
    NAME_LABEL,
)
MAX_TAG_VALUE = 256
TAG_GRAMMAR = Grammar(r"A-Za-z0-9_.:/=+@-", MAX_TAG_VALUE)
"""EC2's tag value characters (spaces left out: one at an end is refused)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}\Z")
GROUP_ID = re.compile(r"^sg-[0-9a-f]{8,17}\Z")

LIVE_STATES = ("pending", "running", "shutting-down", "stopping", "stopped")
"""Every state but ``terminated``: what ``list_by_tag`` reports and what keeps the security
group in use (an instance shutting down still holds it)."""
NAMESAKE_STATES = ("pending", "running", "stopping", "stopped")
"""What a repeated create returns: an instance on its way out is not the one asked for, and a
create after a delete must make a new one."""

_STATES: dict[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "stopping": InstanceState.STOPPED,
    "stopped": InstanceState.STOPPED,
    "shutting-down": InstanceState.TERMINATING,
}


def state_of(name: str, public_ip: str) -> InstanceState:
    """Running only counts once the public address is attached: no address, no proxy URL.
    A spot instance interrupted with ``stop`` lands in Stopped, which the reconciler replaces;
    ``terminated`` never reaches here (it reads as NotFound)."""
    if name == "running":
        return InstanceState.RUNNING if public_ip else InstanceState.PENDING
    return _STATES.get(name, InstanceState.UNKNOWN)


def instance_tags(
    name: str,
    owner_uid: str,
    provider_name: str,
    spec_hash: str,
    *,
    namespace: str = "",
    proxy_name: str = "",
) -> dict[str, str]:
    """The instance's tags; the proxy's namespace and name fitted to EC2's grammar, for the
    console (``services.providers.pure.identity``)."""
    tags = {
        NAME_TAG: name,
        MANAGED_LABEL: "true",
        OWNER_LABEL: owner_uid,
        PROVIDER_LABEL: provider_name,
    }
    if spec_hash:
        tags[SPEC_HASH_LABEL] = spec_hash
    return tags | identity_labels(namespace, proxy_name, TAG_GRAMMAR)


def firewall_tags(
    group_name: str, owner: str, provider_name: str, created_at: datetime
) -> dict[str, str]:
    return {
        NAME_TAG: group_name,
        MANAGED_LABEL: "true",
        OWNER_LABEL: owner,
        PROVIDER_LABEL: provider_name,
        CREATED_AT_LABEL: created_at.astimezone(UTC).isoformat(),
    }


def tag_problem(tags: Mapping[str, str]) -> str:
    """The first tag EC2 would refuse, named, or ``""``: never a silent rewrite (a changed
    owner uid would make the instance an orphan of a proxy that does not exist)."""
    for key, value in tags.items():
        if not value and key != SPEC_HASH_LABEL:
            return f"tag {key} is empty"
        if len(value) > MAX_TAG_VALUE:
            return f"tag {key} is {len(value)} characters long; EC2 allows {MAX_TAG_VALUE}"
        if value != value.strip() or any(ord(c) < 0x20 or c == "\x7f" for c in value):
            return f"tag {key}={value!r} has control characters or surrounding spaces"
    return ""


def tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    """A described resource's ``Tags`` as a mapping (malformed entries skipped)."""
    found: dict[str, str] = {}
    for tag in raw.get("Tags") or ():
        if isinstance(tag, Mapping):
            key, value = tag.get("Key"), tag.get("Value", "")
            if isinstance(key, str) and isinstance(value, str):
                found[key] = value
    return found


def managed_filters(
    provider_name: str, states: Iterable[str] = LIVE_STATES
) -> list[dict[str, Any]]:
    """Managed by this named provider entry (one account may hold several, e.g. aws-eu and
    aws-us), in one of ``states``."""
    return [
        {"Name": f"tag:{MANAGED_LABEL}", "Values": ["true"]},
        {"Name": f"tag:{PROVIDER_LABEL}", "Values": [provider_name]},
        {"Name": "instance-state-name", "Values": list(states)},
    ]


def namesake_filters(provider_name: str, name: str) -> list[dict[str, Any]]:
    return [
        {"Name": f"tag:{NAME_TAG}", "Values": [name]},
        *managed_filters(provider_name, NAMESAKE_STATES),
    ]


def group_filters(provider_name: str) -> list[dict[str, Any]]:
    """Every security group this entry made, in any VPC (a changed ``vpcId`` leaves the old
    VPC's behind, and GC must find it too)."""
    return [
        {"Name": f"tag:{MANAGED_LABEL}", "Values": ["true"]},
        {"Name": f"tag:{PROVIDER_LABEL}", "Values": [provider_name]},
    ]


def parse_time(value: object) -> datetime:
    """A time EC2 gave (botocore's datetime, or ISO text from a tag) in UTC; the epoch when
    missing or unreadable, so something whose age cannot be told counts as old."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return EPOCH
    if not isinstance(value, datetime):
        return EPOCH
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def to_instance(raw: Mapping[str, Any], port: int) -> Instance:
    """One ``Reservations[].Instances[]`` entry of DescribeInstances."""
    tags = tags_of(raw)
    ip = str(raw.get("PublicIpAddress") or "")
    state = raw.get("State") or {}
    created_at = parse_time(raw.get("LaunchTime"))
    labels = {key: tags[key] for key in OUR_KEYS if key in tags}
    labels[CREATED_AT_LABEL] = created_at.isoformat()
    instance_id = str(raw.get("InstanceId", ""))
    return Instance(
        provider_id=instance_id,
        name=tags.get(NAME_TAG, ""),
        state=state_of(str(state.get("Name", "")), ip),
        owner_uid=tags.get(OWNER_LABEL, ""),
        created_at=created_at,
        ip=ip,
        port=port,
        instance_uid=instance_id,
        labels=labels,
    )


def instances_of(pages: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The instances of DescribeInstances pages, in order."""
    return [
        instance
        for page in pages
        for reservation in page.get("Reservations") or ()
        for instance in reservation.get("Instances") or ()
    ]
