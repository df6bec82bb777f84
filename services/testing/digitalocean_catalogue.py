"""What the DigitalOcean fake lists of the account's world: regions, Droplet sizes with the
regions each is offered in, distribution images, and the account itself, in the shapes of
DigitalOcean's public API reference (``/v2/sizes``, ``/v2/images/{id}``, ``/v2/account``).

The catalogue is the fake's, not a copy of today's: it has what the real one has that matters
to the provider, a size offered in some regions only (``s-1vcpu-512mb-10gb``, as in the real
catalogue, where it is missing from several), sizes offered everywhere, and a retired size
(``available: false``, no region). A create of a size outside a region is refused as the API
refuses it (``digitalocean_api``), so a provider that does not check the catalogue fails its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REGIONS = ("ams3", "fra1", "lon1", "nyc1", "nyc3", "sfo3", "sgp1", "tor1", "syd1")
LIMITED_SIZE = "s-1vcpu-512mb-10gb"
LIMITED_REGIONS = ("ams3", "fra1", "nyc1", "sfo3", "sgp1")
"""Where the fake offers ``LIMITED_SIZE``: not lon1, nyc3, tor1 or syd1."""
RETIRED_SIZE = "s-3vcpu-1gb"
NOT_IN_REGION = "Size is not available in this region."
INVALID_SIZE = "You specified an invalid size for Droplet creation."


@dataclass(frozen=True)
class SizeOffer:
    slug: str
    memory: int
    vcpus: int
    disk: int
    price_monthly: float
    regions: tuple[str, ...] = REGIONS
    available: bool = True


SIZE_OFFERS = (
    SizeOffer(LIMITED_SIZE, 512, 1, 10, 4.0, LIMITED_REGIONS),
    SizeOffer("s-1vcpu-1gb", 1024, 1, 25, 6.0),
    SizeOffer("s-1vcpu-2gb", 2048, 1, 50, 12.0),
    SizeOffer("s-2vcpu-4gb", 4096, 2, 80, 24.0),
    SizeOffer(RETIRED_SIZE, 1024, 3, 60, 15.0, (), available=False),
)
SIZE_BY_SLUG = {s.slug: s for s in SIZE_OFFERS}
SIZES = frozenset(SIZE_BY_SLUG)

IMAGE_IDS = {
    "debian-12-x64": 140000001,
    "ubuntu-24-04-x64": 140000002,
    "ubuntu-22-04-x64": 140000003,
}
IMAGES = frozenset(IMAGE_IDS)


def size_body(offer: SizeOffer) -> dict[str, Any]:
    return {
        "slug": offer.slug,
        "memory": offer.memory,
        "vcpus": offer.vcpus,
        "disk": offer.disk,
        "transfer": 1.0,
        "price_monthly": offer.price_monthly,
        "price_hourly": round(offer.price_monthly / 672, 5),
        "regions": list(offer.regions),
        "available": offer.available,
        "description": "Basic",
    }


def size_refusal(size: object, region: object) -> str:
    """The 422 message of a create whose size cannot be made in ``region``; "" when it can."""
    offer = SIZE_BY_SLUG.get(size) if isinstance(size, str) else None
    if offer is None:
        return INVALID_SIZE
    if not offer.available or region not in offer.regions:
        return NOT_IN_REGION
    return ""


def image_body(key: str) -> dict[str, Any] | None:
    """The image by slug or id, as ``/v2/images/{id}`` answers it; None when unknown."""
    slug = next((s for s, i in IMAGE_IDS.items() if key in (s, str(i))), None)
    if slug is None:
        return None
    distribution = "Debian" if slug.startswith("debian") else "Ubuntu"
    return {
        "id": IMAGE_IDS[slug],
        "name": slug.split("-", 1)[1].replace("-", ".").replace(".x64", " x64"),
        "distribution": distribution,
        "slug": slug,
        "public": True,
        "regions": list(REGIONS),
        "created_at": "2024-06-12T19:31:12Z",
        "type": "base",
        "min_disk_size": 7,
        "size_gigabytes": 1.5,
        "description": f"{distribution} x64",
        "tags": [],
        "status": "available",
    }


def account_body(droplet_limit: int, status: str) -> dict[str, Any]:
    return {
        "account": {
            "droplet_limit": droplet_limit,
            "floating_ip_limit": 3,
            "volume_limit": 100,
            "email": "crawler@example.com",
            "name": "Crawler",
            "uuid": "b6fr89dbf6d9156cace5f3c78dc9851d957381ef",
            "email_verified": True,
            "status": status,
            "status_message": "" if status == "active" else "the account is locked: see billing",
        }
    }
