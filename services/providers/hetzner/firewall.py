"""The entry's one Hetzner firewall (docs/decisions/0115-cloud-vms-share-their-squid.md):
found by its name, made when missing, its rule set when ``allowedClients`` changed, deleted
once no server is left. Blocking calls, run in the provider's worker threads.

It is attached to each server in the server's own create request, not by a label selector:
a server never exists for a moment without it, and a firewall applied to a server cannot be
deleted (Hetzner answers ``resource_in_use``), so GC cannot take it from under a server that a
create just made.
"""

from __future__ import annotations

from datetime import datetime

from hcloud import APIException, Client
from hcloud.firewalls import BoundFirewall, FirewallRule

from services.providers.base import Permanent
from services.providers.hetzner.pure import mapping


def hcloud_rules(rules: list[mapping.Rule]) -> list[FirewallRule]:
    return [
        FirewallRule(
            direction=direction,
            protocol=protocol,
            port=port,
            source_ips=sorted(sources, key=lambda s: (":" in s, s)),
            description=mapping.RULE_DESCRIPTION,
        )
        for direction, protocol, port, sources in rules
    ]


def current_rules(firewall: BoundFirewall) -> list[mapping.Rule]:
    return [
        mapping.normalize_rule(rule.direction, rule.protocol, rule.port, rule.source_ips)
        for rule in firewall.data_model.rules or []
    ]


def find(client: Client, name: str, provider_name: str) -> BoundFirewall | None:
    """The firewall called ``name`` (names are unique in a project), if it is this entry's.

    One with the name but not the labels is someone else's: it is neither used nor changed."""
    found = client.firewalls.get_by_name(name)
    if found is None:
        return None
    if not mapping.is_entrys(found.data_model.labels, provider_name):
        raise Permanent(
            f"a firewall named {name} exists without the labels of provider {provider_name} "
            f"({mapping.label_selector(provider_name)}): delete or rename it, or add the "
            "labels to let this provider manage it"
        )
    return found


def ensure(client: Client, name: str, provider_name: str, wanted: list[mapping.Rule]) -> int:
    """The firewall's id, made or its rule set as ``wanted`` first when needed."""
    found = find(client, name, provider_name)
    if found is None:
        try:
            made = client.firewalls.create(
                name=name,
                rules=hcloud_rules(wanted),
                labels=mapping.entry_labels(provider_name),  # type: ignore[arg-type]
            )
        except APIException as exc:
            if exc.code != "uniqueness_error":
                raise
            # Another process made it meanwhile: use that one.
            found = find(client, name, provider_name)
            if found is None:
                raise
        else:
            return int(made.firewall.data_model.id or 0)
    if not mapping.rules_match(current_rules(found), wanted):
        client.firewalls.set_rules(found, hcloud_rules(wanted))
    return int(found.data_model.id or 0)


def leftover(client: Client, name: str, provider_name: str) -> tuple[int, datetime] | None:
    """The firewall's id and creation time, if it exists and is this entry's (one of someone
    else's with the name is not ours to report; the next create says why it cannot be used)."""
    found = client.firewalls.get_by_name(name)
    if found is None or not mapping.is_entrys(found.data_model.labels, provider_name):
        return None
    return int(found.data_model.id or 0), mapping.parse_created(found.data_model.created)


def delete(client: Client, firewall_id: int, provider_name: str) -> bool:
    """Delete the firewall unless a server still uses it (then False); gone already is True.
    Only a firewall with this entry's labels is ever deleted."""
    try:
        found = client.firewalls.get_by_id(firewall_id)
    except APIException as exc:
        if exc.code == "not_found":
            return True
        raise
    if not mapping.is_entrys(found.data_model.labels, provider_name):
        raise Permanent(
            f"firewall {firewall_id} does not carry the labels of provider {provider_name}; "
            "it is not deleted"
        )
    try:
        client.firewalls.delete(found)
    except APIException as exc:
        if exc.code == "not_found":
            return True
        if exc.code == "resource_in_use":
            return False
        raise
    return True


def planned(client: Client, name: str, provider_name: str, wanted: list[mapping.Rule]) -> str:
    """What the next create would do to the entry's firewall, found by a read only; Permanent,
    as a create would be, for a same-named firewall of someone else's."""
    rules = "; ".join(
        f"inbound {protocol.upper()} {port} from {', '.join(sorted(sources))}"
        for _, protocol, port, sources in wanted
    )
    found = find(client, name, provider_name)
    if found is None:
        return f"{name} does not exist yet: the first create makes it, allowing {rules} only"
    if mapping.rules_match(current_rules(found), wanted):
        return f"{name} exists and allows {rules} only"
    return f"{name} exists with other rules: the next create sets them to {rules} only"
