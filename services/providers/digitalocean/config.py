"""The ``digitalocean:`` block of a providers-config entry, validated when the file is read.

``regions``, ``size`` and ``image`` are defaults for a Proxy's ``spec.placement``: a Proxy that
names them wins, one that does not gets one of ``regions`` (chosen by a stable hash of the
instance name) and the rest. Every check names the field and the fix, so a typo stops start-up
instead of failing every create much later. The API token is never part of this block
(docs/providers.md, "digitalocean"): it comes from the environment or from ``tokenFile``.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlparse

from services.providers.cloud.pure.settings import CloudSettings, check_cloud_settings

DEFAULT_REGIONS = ("ams3",)
"""One region: a region is a country to the sites a proxy reaches, so spreading over several is
a choice the operator writes down (one entry per country is the usual way)."""
DEFAULT_SIZE = "s-1vcpu-512mb-10gb"
"""The cheapest Droplet size; a Squid for a crawler's traffic needs no more."""
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
    if not config.regions:
        return f"regions is empty; list at least one region slug, e.g. [{DEFAULT_REGIONS[0]}]"
    if len(config.regions) > MAX_REGIONS:
        return f"regions has {len(config.regions)} entries; at most {MAX_REGIONS}"
    for region in config.regions:
        if not REGION.match(region):
            return f"regions: {shown(region)} is not a region slug; use e.g. ams3, fra1, nyc3"
    if len(set(config.regions)) != len(config.regions):
        return "regions lists a region twice; list each once"
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
    if len(config.ssh_keys) > MAX_SSH_KEYS:
        return f"sshKeys has {len(config.ssh_keys)} keys; at most {MAX_SSH_KEYS}"
    for key in config.ssh_keys:
        if not _SSH_KEY.match(key):
            return (
                f"sshKeys: {shown(key)} is neither a key id (digits) nor an MD5 fingerprint "
                "(aa:bb:...: 16 pairs); `doctl compute ssh-key list` shows both"
            )
    if config.token_file and (not config.token_file.startswith("/") or "\0" in config.token_file):
        return (
            f"tokenFile {shown(config.token_file)}: use an absolute path, e.g. "
            "/var/run/secrets/digitalocean/token (a mounted Secret)"
        )
    return _endpoint_problem(config.endpoint_url)


def shown(value: str, limit: int = 80) -> str:
    """A value quoted for a message, cut short: a pasted blob must not flood the error."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"


def image_ok(image: str) -> bool:
    return bool(IMAGE.match(image))


def _endpoint_problem(endpoint: str) -> str:
    """A token goes in every request's header: over plain http only to this machine (a test
    fake), never across a network."""
    if not endpoint.startswith("http://"):
        return ""
    if loopback(urlparse(endpoint).hostname or ""):
        return ""
    return (
        f"endpointUrl {shown(endpoint)}: plain http would send the API token unencrypted; use "
        "https, or http only to a loopback address (a local test fake)"
    )


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint(config: DigitalOceanConfig) -> str:
    return config.endpoint_url.rstrip("/") or DEFAULT_ENDPOINT
