"""The ``hetzner:`` block of a providers-config entry, validated when the file is read.

``locations``, ``serverType`` and ``image`` are defaults for a Proxy's ``spec.placement``. The
API token is never a field: it is ``HCLOUD_TOKEN`` (what the hcloud CLI reads) or the file
``tokenFile`` names (a Kubernetes Secret mount), read when the first call needs it. Every check
names the field and the fix, so a typo stops start-up instead of failing every create later.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated
from urllib.parse import urlparse

import msgspec

from services.providers.cloud.pure.settings import CloudSettings, check_cloud_settings
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
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


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
    if not config.locations:
        return "locations is empty: list at least one Hetzner location, e.g. [fsn1, nbg1, hel1]"
    if len(config.locations) > MAX_LOCATIONS:
        return f"locations has {len(config.locations)} entries; Hetzner has fewer locations"
    for location in config.locations:
        if not LOCATION.match(location):
            return f"locations: {location!r} is not a Hetzner location; use e.g. fsn1, nbg1, ash"
    if len(set(config.locations)) != len(config.locations):
        return "locations lists a location twice; list each once (spreading is even over them)"
    if not SERVER_TYPE.match(config.server_type):
        return (
            f"serverType {config.server_type!r} is not a Hetzner server type; use e.g. "
            f"{DEFAULT_SERVER_TYPE} (see `hcloud server-type list`)"
        )
    if not IMAGE.match(config.image):
        return f"image {config.image!r}: use an image name such as {DEFAULT_IMAGE}, or its id"
    if len(config.ssh_keys) > MAX_SSH_KEYS:
        return f"sshKeys has {len(config.ssh_keys)} keys; at most {MAX_SSH_KEYS}"
    for key in config.ssh_keys:
        if not _SSH_KEY.match(key):
            return f"sshKeys: {key!r} is not an SSH key name or id (1-128 printable characters)"
    if config.token_file and (not config.token_file.startswith("/") or "\x00" in config.token_file):
        return (
            f"tokenFile {config.token_file!r}: use an absolute path, e.g. "
            "/var/run/secrets/hcloud/token, or leave it out to use HCLOUD_TOKEN"
        )
    return _endpoint_problem(config.endpoint_url)


def _endpoint_problem(endpoint: str) -> str:
    """The API token travels with every request: plain http only to this machine (a fake)."""
    if not endpoint:
        return ""
    url = urlparse(endpoint)
    if url.scheme != "http":
        return ""
    host = (url.hostname or "").lower()
    if host in _LOOPBACK_NAMES:
        return ""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return ""
    except ValueError:
        pass
    return (
        f"endpointUrl {endpoint!r}: plain http would send the API token unencrypted; use "
        "https://, or http:// only to a local test server (127.0.0.1)"
    )
