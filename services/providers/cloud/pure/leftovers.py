"""How a cloud provider entry reports its firewall to GC, and checks what GC hands back.

The rule every cloud follows (``firewall.py`` here, docs/providers.md, "Cloud VMs"): the entry's
firewall is a leftover only once the entry has no instance left in any state, since one stopped
or shutting down still holds it; it is reported as ``FIREWALL_KIND`` with ``firewall_owner`` (no
proxy's uid, so GC judges it by its age alone); and before deleting, the provider looks again,
keeping it (``False``) when an instance has appeared since. Looking, listing and deleting are
each cloud's own calls; what they mean is decided here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TypeVar

from services.providers.base import Leftover, Permanent
from services.providers.cloud.pure.firewall import FIREWALL_KIND, firewall_owner

T = TypeVar("T")


def firewall_leftovers(
    provider_name: str, firewalls: Iterable[tuple[str, datetime]]
) -> list[Leftover]:
    """The leftovers to report for the entry's ``firewalls`` (provider id, creation time), once
    the provider has seen that no instance of the entry is left (it asks before listing them, to
    spare the listing while instances run)."""
    return [
        Leftover(
            provider_id=provider_id,
            owner_uid=firewall_owner(provider_name),
            created_at=created_at,
            kind=FIREWALL_KIND,
        )
        for provider_id, created_at in firewalls
    ]


def firewall_id_of(
    provider_name: str, leftover: Leftover, parse: Callable[[str], T | None], form: str
) -> T:
    """The cloud's id of a firewall this entry reported (``parse`` reads it from the provider
    id); anything else is Permanent, before any call: GC passes back only what the provider
    listed, so another kind or id is a mix-up to stop at, never a resource to delete."""
    found = parse(leftover.provider_id) if leftover.kind == FIREWALL_KIND else None
    if found is None:
        raise Permanent(
            f"{provider_name}: {leftover.kind} {leftover.provider_id!r} is not a leftover this "
            f"provider reports (only its firewall, {FIREWALL_KIND} {form})"
        )
    return found
