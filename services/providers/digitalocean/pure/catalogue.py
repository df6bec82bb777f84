"""DigitalOcean's own catalogue of Droplet sizes, read as a question: can this size be made in
this region (D142)?

Sizes are not offered in every region (``s-1vcpu-512mb-10gb`` is missing from several), and a
create of one where it is not offered answers 422 "Size is not available in this region" after
the firewall and the name lookup have been made. ``/v2/sizes`` lists every size with the regions
where new Droplets of it can be made and whether it can be made at all (``available``), so the
answer is known before a create, and at start-up, with the regions where the size would work.
The messages name the field the value came from and what to change it to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_SIZES = 1000
"""A bound on what is kept of an answer: DigitalOcean lists about 150 sizes."""
SHOWN = 4
"""How many sizes a message proposes: the cheapest offered in the region."""


@dataclass(frozen=True, slots=True)
class Size:
    slug: str
    available: bool
    regions: frozenset[str]
    price_monthly: float
    """0.0 when the answer does not say; used only to order proposals."""


def size_of(raw: object) -> Size | None:
    """A size from one item of ``/v2/sizes``; None for anything without a slug. Missing fields
    count against the size: an unreadable ``available`` is not available, unreadable regions
    are none."""
    if not isinstance(raw, Mapping):
        return None
    slug = raw.get("slug")
    if not isinstance(slug, str) or not slug:
        return None
    regions = raw.get("regions")
    price = raw.get("price_monthly")
    return Size(
        slug=slug,
        available=raw.get("available") is True,
        regions=frozenset(r for r in regions if isinstance(r, str))
        if isinstance(regions, list)
        else frozenset(),
        price_monthly=float(price)
        if isinstance(price, int | float) and not isinstance(price, bool)
        else 0.0,
    )


def sizes_of(items: Iterable[object]) -> dict[str, Size]:
    """The catalogue from the items of every page, at most ``MAX_SIZES`` of them."""
    sizes: dict[str, Size] = {}
    for raw in items:
        size = size_of(raw)
        if size is not None and len(sizes) < MAX_SIZES:
            sizes[size.slug] = size
    return sizes


def offered_in(sizes: Mapping[str, Size], region: str) -> list[str]:
    """The sizes new Droplets can have in ``region``, cheapest first."""
    found = [s for s in sizes.values() if s.available and region in s.regions]
    return [s.slug for s in sorted(found, key=lambda s: (s.price_monthly, s.slug))]


def size_problem(sizes: Mapping[str, Size], size: str, region: str, field: str) -> str:
    """Why ``size`` (the value of ``field``) cannot be made in ``region``, with the fix; ""
    when it can."""
    found = sizes.get(size)
    if found is not None and found.available and region in found.regions:
        return ""
    proposals = offered_in(sizes, region)[:SHOWN]
    instead = (
        f"a size offered in {region} such as {', '.join(proposals)}"
        if proposals
        else f"another region: DigitalOcean lists no size for {region}"
    )
    if found is None:
        return (
            f"{field} {size!r} is not a DigitalOcean Droplet size (its /v2/sizes does not list "
            f"it); use {instead}"
        )
    if not found.available or not found.regions:
        return (
            f"{field} {size!r} is not offered for new Droplets in any region any more; "
            f"use {instead}"
        )
    return (
        f"{field} {size!r} is not offered in region {region} (DigitalOcean offers it in "
        f"{', '.join(sorted(found.regions))}); use one of those regions, or {instead}"
    )
