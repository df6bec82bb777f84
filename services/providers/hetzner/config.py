"""The ``hetzner:`` block of a providers-config entry, validated when the file is read.

``locations``, ``serverType`` and ``image`` are defaults for a Proxy's ``spec.placement``. The
API token is never a field: it is ``HCLOUD_TOKEN`` (what the hcloud CLI reads) or the file
``tokenFile`` names (a Kubernetes Secret mount), read when the first call needs it. Every check
names the field and the fix, so a typo stops start-up instead of failing every create later.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from services.providers.cloud.pure.settings import (
    CloudSettings,
    check_cloud_settings,
    places_problem,
    shown,
    ssh_keys_problem,
    token_api_problem,
)
from services.providers.hetzner.pure.mapping import IMAGE, LOCATION, SERVER_TYPE

DEFAULT_ENDPOINT = "https://api.hetzner.cloud"
API_PATH = "/v1"
DEFAULT_LOCATIONS = ("fsn1", "nbg1", "hel1")
DEFAULT_SERVER_TYPE = "cx23"
"""The cheapest shared-vCPU x86 type when this was written (2 vCPU, 4 GB, EU locations only);
types come and go, so an operator sets ``serverType`` (docs/providers.md, "hetzner")."""
DEFAULT_IMAGE = "debian-12"
MAX_LOCATIONS = 32
MAX_SSH_KEYS = 32
_SSH_KEY = re.compile(r"^[^\x00-\x1f\x7f]{1,128}\Z")


class HetznerConfig(CloudSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Settings of one named hetzner provider; see docs/providers.md for each field."""

    locations: tuple[str, ...] = DEFAULT_LOCATIONS
    server_type: str = DEFAULT_SERVER_TYPE
    image: str = DEFAULT_IMAGE
    network: Annotated[int, msgspec.Meta(ge=0)] = 0
    """A private network's id to attach each server to as well (0: none)."""
    ssh_keys: tuple[str, ...] = ()
    """Names or ids of SSH keys in the project, for a person to log in (with a firewall of
    their own opening port 22: ours opens only the proxy port)."""
    ipv6: bool = False
    """Give each server a public IPv6 too; the proxy is still reached on its IPv4."""
    token_file: str = ""

    def __post_init__(self) -> None:
        problem = check_cloud_settings(self) or validate(self)
        if problem:
            raise ValueError(problem)

    @property
    def api_endpoint(self) -> str:
        """The base URL hcloud is given: ``endpointUrl`` (no path) plus ``/v1``."""
        return (self.endpoint_url.rstrip("/") or DEFAULT_ENDPOINT) + API_PATH


def validate(config: HetznerConfig) -> str:
    """The first Hetzner-specific problem with ``config``, or ``""``."""
    problem = places_problem(
        "locations",
        config.locations,
        MAX_LOCATIONS,
        noun="a location",
        pattern=LOCATION,
        what="a Hetzner location; use e.g. fsn1, nbg1, ash",
        required=f"list at least one Hetzner location, e.g. [{', '.join(DEFAULT_LOCATIONS)}]",
    )
    if problem:
        return problem
    if not SERVER_TYPE.match(config.server_type):
        return (
            f"serverType {shown(config.server_type)} is not a Hetzner server type; use e.g. "
            f"{DEFAULT_SERVER_TYPE} (see `hcloud server-type list`)"
        )
    if not IMAGE.match(config.image):
        return f"image {shown(config.image)}: use an image name such as {DEFAULT_IMAGE}, or its id"
    return ssh_keys_problem(
        config.ssh_keys,
        MAX_SSH_KEYS,
        _SSH_KEY,
        "an SSH key name or id (1-128 printable characters)",
    ) or token_api_problem(
        config.token_file,
        config.endpoint_url,
        example="/var/run/secrets/hcloud/token",
        variable="HCLOUD_TOKEN",
    )
