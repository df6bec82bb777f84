"""The ``kvm:`` block of a providers-config entry, its start-up validation and placement.

Validation is pure (it reads no file) so every rule is unit-tested; the provider reads the key and
known_hosts files itself at start-up. Every problem is reported at once, each naming its field
(``kvm.hosts[1].address``) and the fix: a typo in a hypervisor entry would otherwise surface much
later as failed proxies on that host only.

Placement maps a Proxy's ``spec.placement`` onto this config: ``zone`` is a host name,
``machineType`` and ``image`` are keys (an image may also be a direct http(s) URL). A field may be
left empty when exactly one choice is configured. Anything else is the Proxy's mistake, so it is
``Permanent``: retrying cannot make an unknown host appear.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlparse

import msgspec

from services.providers.base import Permanent
from services.providers.pure.targets import AllowedTarget, targets_problem
from services.runtime.settings.errors import ConfigError

DEFAULT_SOCKET = "/var/run/libvirt/libvirt-sock"
DOMAIN_TYPES = ("kvm", "qemu")
IMAGE_FORMATS = ("qcow2", "raw")

# cloud-init merges vendor-data *under* user-data: a user-data that sets its own `packages:` or
# `runcmd:` replaces these lists (docs/kvm.md, known gaps). Debian's qemu-guest-agent unit is
# started by udev when the channel appears, which on first boot happened before the install.
DEFAULT_VENDOR_DATA = """\
#cloud-config
packages:
  - qemu-guest-agent
runcmd:
  - [systemctl, start, qemu-guest-agent]
"""

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}\Z")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")
_ADDRESS_EXAMPLE = "use host:port, e.g. hv1.lan:22, 192.0.2.10:22 or [2001:db8::10]:22"


class ImageConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """A cloud image: downloaded once per host into the pool, then shared by overlays."""

    url: str
    sha256: str = ""
    format: str = "qcow2"

    def __post_init__(self) -> None:
        # sha256sum prints lowercase; the marker volume holds hashlib's lowercase hexdigest.
        if self.sha256 != self.sha256.lower():
            msgspec.structs.force_setattr(self, "sha256", self.sha256.lower())


class MachineTypeConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    vcpus: int
    # "MiB", not the "Mib" the camel renaming would spell.
    memory_mib: int = msgspec.field(name="memoryMiB")


class HostConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """One hypervisor: reached by SSH at ``address`` as ``user``, libvirt's unix ``socket``
    forwarded over that connection; VMs' disks in ``pool``, their NIC on ``bridge``."""

    name: str
    address: str
    user: str
    bridge: str
    socket: str = DEFAULT_SOCKET
    pool: str = "default"

    @property
    def hostname(self) -> str:
        """The host part of ``address``, IPv6 without its brackets (what a socket connects to)."""
        return parse_address(self.address)[0]

    @property
    def port(self) -> int:
        return parse_address(self.address)[1]


class KvmConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """The ``kvm:`` block; see docs/kvm.md for every field."""

    ssh_key_file: str
    known_hosts_file: str = ""
    insecure_ignore_host_key: bool = False
    disk_size_gb: int = 10
    vendor_data: str = DEFAULT_VENDOR_DATA
    images: dict[str, ImageConfig] = {}
    machine_types: dict[str, MachineTypeConfig] = {}
    hosts: list[HostConfig] = []
    domain_type: str = "kvm"
    connect_timeout: float = 30.0
    keepalive_interval: float = 15.0
    allowed_targets: tuple[AllowedTarget, ...] = ()
    """Non-public ranges and ports the guests' Squid may reach (D134)."""


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` → (host, port); host is a DNS name, an IPv4 address or a bracketed IPv6
    address. Raises ValueError saying what is wrong."""
    if address.startswith("["):
        inner, sep, rest = address[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError("an IPv6 address needs brackets and a port")
        host, port_text = inner, rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError as exc:
            raise ValueError(f"{host!r} is not an IPv6 address") from exc
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep or not host:
            raise ValueError("the port is missing")
        if ":" in host:
            raise ValueError("an IPv6 address needs brackets")
        if not _is_hostname(host):
            raise ValueError(f"{host!r} is neither a host name nor an IPv4 address")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _is_hostname(host: str) -> bool:
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def _is_http_url(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("http", "https") and bool(parsed.hostname)


def validate_kvm_config(config: KvmConfig) -> None:
    """Every rule of the ``kvm:`` block; raises one ConfigError listing every problem."""
    errors = [*_check_top(config), *_check_images(config), *_check_machine_types(config)]
    errors += _check_hosts(config)
    if errors:
        raise ConfigError("; ".join(errors))


def _check_top(config: KvmConfig) -> list[str]:
    errors: list[str] = []
    if not config.ssh_key_file:
        errors.append("kvm.sshKeyFile is required: the private key the provider logs in with")
    if not config.known_hosts_file and not config.insecure_ignore_host_key:
        errors.append(
            "kvm.knownHostsFile is required: a known_hosts file with every hypervisor's host key "
            "(or set insecureIgnoreHostKey: true, which trusts any host key)"
        )
    if config.disk_size_gb <= 0:
        errors.append(f"kvm.diskSizeGb is {config.disk_size_gb}: use a size in GB above 0")
    if config.domain_type not in DOMAIN_TYPES:
        errors.append(
            f"kvm.domainType is {config.domain_type!r}: use kvm (hardware virtualisation) or "
            "qemu (emulation, for hosts without /dev/kvm)"
        )
    if config.connect_timeout <= 0:
        errors.append(f"kvm.connectTimeout is {config.connect_timeout}: use seconds above 0")
    if config.keepalive_interval <= 0:
        errors.append(f"kvm.keepaliveInterval is {config.keepalive_interval}: use seconds above 0")
    problem = targets_problem(config.allowed_targets, "kvm.allowedTargets")
    if problem:
        errors.append(problem)
    return errors


def _check_images(config: KvmConfig) -> list[str]:
    errors: list[str] = []
    for key, image in config.images.items():
        field = f"kvm.images.{key}"
        if not key:
            errors.append("kvm.images: an image has an empty name; name it, e.g. debian-12")
        if not _is_http_url(image.url):
            errors.append(f"{field}.url is {image.url!r}: use an http:// or https:// URL")
        if image.sha256 and not _SHA256.match(image.sha256):
            errors.append(
                f"{field}.sha256 is {image.sha256!r}: use the 64 hex digits sha256sum prints, "
                "or leave it out"
            )
        if image.format not in IMAGE_FORMATS:
            errors.append(f"{field}.format is {image.format!r}: use qcow2 or raw")
    return errors


def _check_machine_types(config: KvmConfig) -> list[str]:
    if not config.machine_types:
        return ["kvm.machineTypes is empty: define one, e.g. small: {vcpus: 1, memoryMiB: 1024}"]
    errors: list[str] = []
    for key, machine in config.machine_types.items():
        field = f"kvm.machineTypes.{key}"
        if not key:
            errors.append("kvm.machineTypes: a machine type has an empty name; name it")
        if machine.vcpus <= 0:
            errors.append(f"{field}.vcpus is {machine.vcpus}: use 1 or more")
        if machine.memory_mib <= 0:
            errors.append(f"{field}.memoryMiB is {machine.memory_mib}: use MiB above 0, e.g. 1024")
    return errors


def _check_hosts(config: KvmConfig) -> list[str]:
    if not config.hosts:
        return ["kvm.hosts is empty: list at least one hypervisor (name, address, user, bridge)"]
    errors: list[str] = []
    seen: dict[str, int] = {}
    for index, host in enumerate(config.hosts):
        field = f"kvm.hosts[{index}]"
        if not host.name:
            errors.append(f"{field}.name is required: what spec.placement.zone refers to")
        elif host.name in seen:
            errors.append(
                f"{field}.name {host.name!r} is already used by kvm.hosts[{seen[host.name]}]; "
                "give every host its own name"
            )
        else:
            seen[host.name] = index
        try:
            parse_address(host.address)
        except ValueError as exc:
            errors.append(f"{field}.address is {host.address!r}: {exc}; {_ADDRESS_EXAMPLE}")
        if not host.user:
            errors.append(f"{field}.user is required: the SSH user (a member of group libvirt)")
        if not host.bridge:
            errors.append(f"{field}.bridge is required: the host bridge VMs' NICs join, e.g. br0")
        if not host.socket.startswith("/"):
            errors.append(
                f"{field}.socket is {host.socket!r}: use the absolute path of libvirtd's socket "
                f"on the host, e.g. {DEFAULT_SOCKET}"
            )
        if not host.pool:
            errors.append(f"{field}.pool is empty: name a libvirt storage pool, e.g. default")
    return errors


@dataclass(frozen=True, slots=True)
class KvmPlacement:
    """Where and what to boot: a Proxy's placement resolved against the config."""

    host: HostConfig
    machine_type: MachineTypeConfig
    image: ImageConfig
    image_key: str


def resolve_placement(config: KvmConfig, zone: str, machine_type: str, image: str) -> KvmPlacement:
    """``spec.placement`` → host, machine type and image; Permanent when it names nothing."""
    hosts = {host.name: host for host in config.hosts}
    host = hosts[_pick("zone", zone, list(hosts), "host")]
    machine_key = _pick("machineType", machine_type, list(config.machine_types), "machine type")
    if image and image not in config.images and _is_http_url(image):
        return KvmPlacement(host, config.machine_types[machine_key], ImageConfig(url=image), image)
    image_key = _pick("image", image, list(config.images), "image", url_ok=True)
    return KvmPlacement(
        host, config.machine_types[machine_key], config.images[image_key], image_key
    )


def _pick(field: str, value: str, known: list[str], what: str, *, url_ok: bool = False) -> str:
    if value in known:
        return value
    if not value and len(known) == 1:
        return known[0]
    choices = ", ".join(sorted(known)) or "none configured"
    alternative = " or an http(s) URL" if url_ok else ""
    if not value:
        raise Permanent(
            f"spec.placement.{field} is empty and {len(known)} {what}s are configured; "
            f"set it to one of: {choices}{alternative}"
        )
    raise Permanent(
        f"spec.placement.{field} {value!r} is not a configured {what}; "
        f"use one of: {choices}{alternative}"
    )
