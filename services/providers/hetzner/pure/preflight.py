"""What the hetzner preflight says about what Hetzner answered: pure, so each wording is tested
without a server (docs/decisions/0141-hetzner-places-from-its-catalogue.md).

Each check is ``(check, ok, detail, fix)``; ``preflight.py`` makes them ``Finding``s (this
package may not import the runner, which runs asyncio).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from services.providers.hetzner.pure.catalogue import TypeInfo, offered, type_problem

Check = tuple[str, bool, str, str]
APT_FLAVORS = frozenset({"debian", "ubuntu"})
"""The images the Squid part runs on: it installs with apt (docs/providers.md, "hetzner")."""
KNOWN_IMAGES = "debian-12, debian-13, ubuntu-22.04, ubuntu-24.04"
QUOTA = (
    "Hetzner's API has no quota endpoint to read: the project's server limit (Cloud Console, "
    "Limits) shows only when a create passes it, as resource_limit_exceeded (QuotaExceeded, "
    "retried every minute)"
)


def sizes(info: TypeInfo, locations: Sequence[str], now: datetime) -> list[Check]:
    """One check per listed location (``size in fsn1``), and one more when the type is offered
    but sold out in every one of them."""
    if not info.known:
        problem = type_problem(info, locations, type_field="serverType", location_field="", now=now)
        return [("size", False, problem, "set serverType to a type Hetzner lists")]
    where = offered(info, now)
    checks: list[Check] = []
    for location in locations:
        offer = info.offer(location)
        if offer is None or location not in where:
            elsewhere = ", ".join(where) or "no location any more"
            checks.append(
                (
                    f"size in {location}",
                    False,
                    f"{info.name} is not offered in {location}; Hetzner offers it in {elsewhere}",
                    f"remove {location} from locations, or set serverType to a type offered "
                    "in every location listed",
                )
            )
            continue
        price = f", {offer.monthly} EUR a month gross" if offer.monthly else ""
        notes = [f"{info.name} is offered in {location}{price}"]
        if not offer.available:
            notes.append("but Hetzner marks it not available now: creates move on to the next")
        if offer.unavailable_after is not None:
            notes.append(
                f"deprecated there: unavailable after {offer.unavailable_after:%Y-%m-%d}, "
                "choose its successor before then"
            )
        checks.append((f"size in {location}", True, "; ".join(notes), ""))
    listed = [info.offer(location) for location in locations if location in where]
    if listed and not any(offer is not None and offer.available for offer in listed):
        checks.append(
            (
                "capacity",
                False,
                f"{info.name} is not available now in any location listed: creates wait "
                "(QuotaExceeded, retried every minute) until one has room",
                "list more locations, or set serverType to a type available now",
            )
        )
    return checks


def image(
    wanted: str,
    architecture: str,
    found: tuple[int, str, str, str] | None,
    *,
    install_squid: bool,
) -> Check:
    """``found``: the image's (id, type, os flavor, os version), None when Hetzner has none."""
    if found is None:
        return (
            "image",
            False,
            f"Hetzner has no image {wanted!r} for {architecture} servers",
            f"set image to a system image Hetzner lists for {architecture}, e.g. {KNOWN_IMAGES}",
        )
    image_id, kind, flavor, version = found
    what = f"{wanted} (id {image_id}, {kind} image, {flavor or '?'} {version or ''}".rstrip()
    if flavor in APT_FLAVORS:
        note = (
            "known to run the Squid part"
            if kind == "system"
            else "runs the Squid part if cloud-init is still in it"
        )
        return ("image", True, f"{what}): {note}", "")
    if not install_squid:
        return ("image", True, f"{what}): the Proxies' cloudInit installs Squid", "")
    return (
        "image",
        False,
        f"{what}): the Squid part installs with apt, on Debian or Ubuntu only",
        f"set image to one of {KNOWN_IMAGES}, or installSquid: false with a cloudInit that "
        "installs Squid",
    )
