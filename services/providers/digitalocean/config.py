"""The ``digitalocean:`` block of a providers-config entry, validated when the file is read.

``regions``, ``size`` and ``image`` are defaults for a Proxy's ``spec.placement``: a Proxy that
names them wins, one that does not gets one of ``regions`` (chosen by a stable hash of the
instance name) and the rest. Every check names the field and the fix, so a typo stops start-up
instead of failing every create much later. The API token is never part of this block
(docs/providers.md, "digitalocean"): it comes from the environment or from ``tokenFile``.
"""

from __future__ import annotations

import re

from services.providers.cloud.pure.settings import (
    CloudSettings,
    check_cloud_settings,
    places_problem,
    shown,
    ssh_keys_problem,
    token_api_problem,
)

DEFAULT_REGIONS = ("ams3",)
"""One region: a region is a country to the sites a proxy reaches, so spreading over several is
a choice the operator writes down (one entry per country is the usual way)."""
DEFAULT_SIZE = "s-1vcpu-1gb"
"""The cheapest Droplet size offered in every region (D142): the cheaper ``s-1vcpu-512mb-10gb``
is missing from several, and a default must work wherever ``regions`` points. An entry may name
the cheaper one; the catalogue check says where it is offered."""
DEFAULT_IMAGE = "debian-12-x64"
DEFAULT_ENDPOINT = "https://api.digitalocean.com"
TOKEN_VARIABLES = ("DIGITALOCEAN_TOKEN", "DIGITALOCEAN_ACCESS_TOKEN")
"""Read in this order; the second is the name ``doctl`` uses."""
MAX_REGIONS = 16
MAX_SSH_KEYS = 20

REGION = re.compile(r"^[a-z]{2,8}[0-9]{1,3}\Z")
SIZE = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\Z")
IMAGE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}\Z")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_SSH_KEY = re.compile(r"^([1-9][0-9]{0,18}|([0-9a-f]{2}:){15}[0-9a-f]{2})\Z")


class DigitalOceanConfig(
    CloudSettings, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """Settings of one named digitalocean provider; see docs/providers.md for each field."""

    regions: tuple[str, ...] = DEFAULT_REGIONS
    size: str = DEFAULT_SIZE
    image: str = DEFAULT_IMAGE
    vpc_uuid: str = ""
    ssh_keys: tuple[str, ...] = ()
    token_file: str = ""
    """A file holding the API token (a mounted Kubernetes Secret); read at the first call and
    again after the API refuses the token, so a rotated Secret is picked up."""
    ipv6: bool = False

    def __post_init__(self) -> None:
        problem = check_cloud_settings(self) or validate(self)
        if problem:
            raise ValueError(problem)


def validate(config: DigitalOceanConfig) -> str:
    """The first problem with the DigitalOcean fields, or ``""``."""
    problem = places_problem(
        "regions",
        config.regions,
        MAX_REGIONS,
        noun="a region",
        pattern=REGION,
        what="a region slug; use e.g. ams3, fra1, nyc3",
        required=f"list at least one region slug, e.g. [{DEFAULT_REGIONS[0]}]",
    )
    if problem:
        return problem
    if not SIZE.match(config.size):
        return f"size {shown(config.size)}: use a size slug such as {DEFAULT_SIZE}"
    if not image_ok(config.image):
        return (
            f"image {shown(config.image)}: use an image slug such as {DEFAULT_IMAGE}, "
            "or an image id"
        )
    if config.vpc_uuid and not _UUID.match(config.vpc_uuid):
        return (
            f"vpcUuid {shown(config.vpc_uuid)}: use the VPC's id (a lowercase UUID), "
            "or leave it out"
        )
    return ssh_keys_problem(
        config.ssh_keys,
        MAX_SSH_KEYS,
        _SSH_KEY,
        "a key id (digits) or an MD5 fingerprint (aa:bb:...: 16 pairs); "
        "`doctl compute ssh-key list` shows both",
    ) or token_api_problem(
        config.token_file,
        config.endpoint_url,
        example="/var/run/secrets/digitalocean/token",
        variable=TOKEN_VARIABLES[0],
    )


def image_ok(image: str) -> bool:
    return bool(IMAGE.match(image))


def endpoint(config: DigitalOceanConfig) -> str:
    return config.endpoint_url.rstrip("/") or DEFAULT_ENDPOINT
