"""Which server types Hetzner offers where, the order a create walks its locations in, and the
catalogue cache (docs/decisions/0141-hetzner-places-from-its-catalogue.md).

Hetzner offers each server type in some locations only (``cx23`` in the EU ones; ``GET
/server_types`` lists each type's ``locations``, and its ``prices`` per location where it is
offered), and answers a create elsewhere with ``invalid_input`` "unsupported location for server
type". The provider reads the type's entry before a create and at preflight, so a config that
cannot work is refused naming the field and where it would work, never retried.

A location without capacity answers ``resource_unavailable`` (412) instead: that passes, so a
create moves on to the next location of the entry's list (``walk``), starting from the one the
name's stable hash picks, so a repeated create asks in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from services.providers.cloud.pure.spread import spread

CACHE_SIZE = 64
"""Types remembered per provider instance: an entry's ``serverType`` and the Proxies' own
``machineType`` values, which a spec may set to anything. Each is believed an hour
(``cloud.pure.expiring``): Hetzner changes offers by the week, not the minute, and a create that
meets a change anyway (``invalid_input``) drops the entry."""
CAPACITY_CODES = frozenset({"resource_unavailable", "placement_error", "no_space_left_in_location"})
"""Answers that say *this location* has no room now: a create moves on. The project's own
limit (``resource_limit_exceeded``) holds in every location, so it does not."""
EXAMPLE_TYPE = "cpx22"


@dataclass(frozen=True, slots=True)
class Offer:
    """One location a type is listed in. ``available``: Hetzner's word that it can be ordered
    there now (False: sold out for a while); ``unavailable_after``: the end of a deprecation
    announced for the location; ``monthly``: the gross monthly price as Hetzner writes it."""

    location: str
    available: bool = True
    unavailable_after: datetime | None = None
    monthly: str = ""


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """A server type's catalogue entry; ``known`` false when Hetzner has no type of the name
    (cached too: every create of a misspelt type would ask again otherwise)."""

    name: str
    architecture: str = ""
    offers: tuple[Offer, ...] = ()
    known: bool = True

    def offer(self, location: str) -> Offer | None:
        return next((o for o in self.offers if o.location == location), None)


def unknown(name: str) -> TypeInfo:
    return TypeInfo(name, known=False)


def offered(info: TypeInfo, now: datetime) -> list[str]:
    """The locations a create of ``info`` may name at ``now``: listed, and not past the end of
    a deprecation there."""
    return [
        o.location for o in info.offers if o.unavailable_after is None or o.unavailable_after > now
    ]


def walk(locations: Sequence[str], name: str) -> list[str]:
    """Every location of ``locations`` once, from the one ``name``'s hash picks, in list order
    after it (wrapping): the same order for every attempt of one name, a different start for
    each name (the fleet still spreads). ``locations`` holds no duplicates (config checks it)."""
    first = list(locations).index(spread(locations, name))
    return [*locations[first:], *locations[:first]]


def fields(zone: str, region: str, machine_type: str) -> tuple[str, str]:
    """The config or spec field that chose the location ("" when the entry's list did) and the
    one that chose the server type, for messages that say what to change."""
    location_field = "spec.placement.zone" if zone else "spec.placement.region" if region else ""
    type_field = "spec.placement.machineType" if machine_type else "serverType"
    return location_field, type_field


def type_problem(
    info: TypeInfo, route: Sequence[str], *, type_field: str, location_field: str, now: datetime
) -> str:
    """Why a create of ``info`` over ``route`` (the locations it may go to) cannot work, naming
    the field and where it would, or ``""``.

    Every location of an entry's list must offer the type, not just the one a name's hash
    picks: a config that works for some Proxies and fails the others would be found one Proxy
    at a time, and a create that moves on for capacity may reach any of them."""
    if not info.known:
        return (
            f"{type_field} {info.name!r}: Hetzner has no server type of that name "
            f"(GET /server_types): set one `hcloud server-type list` shows, e.g. {EXAMPLE_TYPE}"
        )
    where = offered(info, now)
    missing = [location for location in route if location not in where]
    if not missing:
        return ""
    elsewhere = ", ".join(where) if where else "no location any more"
    if location_field:
        return (
            f"{type_field} {info.name} is not offered in {location_field} {missing[0]}; "
            f"Hetzner offers it in {elsewhere}: set {location_field} to one of those, or "
            f"{type_field} to a type offered in {missing[0]}"
        )
    return (
        f"{type_field} {info.name} is not offered in {', '.join(missing)} (listed in "
        f"locations); Hetzner offers it in {elsewhere}: list only locations that offer it, or "
        f"set {type_field} to a type offered in every location listed"
    )


def no_room(server_type: str, tried: Sequence[tuple[str, str]], *, location_field: str) -> str:
    """The message when no location had room: each location tried, in order, with Hetzner's
    answer there; what the executor does (QuotaExceeded: it retries slowly) and what helps."""
    answers = ", ".join(f"{location} ({answer})" for location, answer in tried)
    if location_field:
        scope = f"{location_field} {answers}, a Proxy's own placement (not moved)"
        fix = f"clear {location_field} to let the entry's locations be tried"
    else:
        scope = f"any location of locations, tried in this order: {answers}"
        fix = "list more locations, or set serverType to a type with room"
    return f"no capacity for server type {server_type} in {scope}; retried every minute: {fix}"
