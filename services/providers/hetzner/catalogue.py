"""Hetzner's catalogue as the provider reads it: a server type's locations and an image, through
``hcloud`` (blocking calls, run in the provider's worker threads). What is done with them is
``pure.catalogue``'s (docs/decisions/0141-hetzner-places-from-its-catalogue.md).

Only what the API answers is read, and defensively: a field hcloud could not fill (an older API
answer, a proxy's page read as JSON) is left out of the offer rather than raising here, where it
would read as a bug of ours instead of a bad answer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hcloud import APIException, Client
from hcloud.images import BoundImage
from hcloud.server_types import ServerType

from services.providers.hetzner.pure.catalogue import Offer, TypeInfo, unknown

DEFAULT_ARCHITECTURE = "x86"


def server_type(client: Client, name: str) -> TypeInfo:
    """``name``'s catalogue entry (one request: ``GET /server_types?name=``)."""
    found = client.server_types.get_by_name(name)
    if found is None:
        return unknown(name)
    return type_info(name, found.data_model)


def type_info(name: str, model: ServerType) -> TypeInfo:
    prices = _monthly_prices(model.prices)
    offers: list[Offer] = []
    if model.locations is None:
        # An answer from before per-location types: its prices list where it is offered.
        offers = [Offer(location, monthly=price) for location, price in prices.items()]
    for entry in model.locations or []:
        location = getattr(getattr(entry.location, "data_model", None), "name", None)
        if not isinstance(location, str) or not location:
            continue
        ends = getattr(entry.deprecation, "unavailable_after", None)
        offers.append(
            Offer(
                location,
                available=entry.available is not False,
                unavailable_after=_utc(ends) if isinstance(ends, datetime) else None,
                monthly=prices.get(location, ""),
            )
        )
    architecture = model.architecture if isinstance(model.architecture, str) else ""
    return TypeInfo(name, architecture=architecture, offers=tuple(offers))


def find_image(client: Client, image: str, architecture: str) -> BoundImage | None:
    """The image a create naming ``image`` would get on a server of ``architecture``: by id,
    or by name for that architecture (Hetzner keeps one ``debian-12`` per architecture)."""
    if image.isdigit():
        try:
            return client.images.get_by_id(int(image))
        except APIException as exc:
            if exc.code == "not_found":
                return None
            raise
    return client.images.get_by_name_and_architecture(image, architecture or DEFAULT_ARCHITECTURE)


def _monthly_prices(prices: Any) -> dict[str, str]:
    found: dict[str, str] = {}
    for price in prices if isinstance(prices, list) else []:
        if not isinstance(price, dict) or not isinstance(price.get("location"), str):
            continue
        monthly = price.get("price_monthly")
        gross = monthly.get("gross") if isinstance(monthly, dict) else None
        found[price["location"]] = gross if isinstance(gross, str) else ""
    return found


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
