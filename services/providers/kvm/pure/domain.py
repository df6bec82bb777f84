"""Pure libvirt XML: the domain, its ``<metadata>``, the storage volumes, and their names.

libvirt has no labels, so what makes a domain ours is a ``<metadata>`` element in our namespace
carrying ``managed``, the owner uid and the creation time: GC lists domains by it. libvirt hands
the element back prefixed (in the domain XML), in the default namespace, or stripped of its
namespace (``dom.metadata()``), so parsing matches on the namespace URI, never on the prefix.

Volume names are the only state the image cache and the per-VM cleanup have:

- ``<vm>.qcow2`` (the VM's disk, a qcow2 overlay) and ``<vm>-seed.iso`` (its NoCloud seed);
- ``egress-base-<digest>`` (a downloaded image) and ``<base>-sha256`` (its marker, holding the
  sha256 of the verified upload). The digest is the image's configured sha256, or a hash of its URL
  and format: a changed image gets a new base instead of replacing one that overlays back onto.

Only names the reconciler makes (``px-<uid>-<hash>``) count as per-VM volumes when a pool is
scanned for leftovers: a pool is often shared with volumes that are not ours, such as an
operator's ``debian.qcow2``, and those must never be reported for deletion.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from services.providers.base import NAME_LABEL, NAMESPACE_LABEL, Permanent
from services.providers.kvm.pure.config import ImageConfig
from services.providers.pure.identity import Grammar, identity_labels

METADATA_NS = "https://crawl.example.com/egress-proxies/kvm"
METADATA_PREFIX = "egress"
BASE_PREFIX = "egress-base-"
OVERLAY_SUFFIX = ".qcow2"
SEED_SUFFIX = "-seed.iso"
MARKER_SUFFIX = "-sha256"
GUEST_AGENT_CHANNEL = "org.qemu.guest_agent.0"

# A VM name is also the guest's hostname and part of volume names: one DNS label.
VM_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
# What services.reconciler names instances: px-<owner uid>-<spec hash prefix>.
RECONCILER_NAME = re.compile(r"^px-(?P<uid>[a-z0-9][a-z0-9-]*)-[0-9a-f]{8}\Z")
_MAC = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}\Z")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True, slots=True)
class DomainSpec:
    """Everything the domain XML depends on; disks are pool volumes, so the XML holds no host
    path and survives a pool moving."""

    name: str
    vcpus: int
    memory_mib: int
    domain_type: str
    pool: str
    disk_volume: str
    seed_volume: str
    bridge: str
    owner_uid: str
    created_at: datetime
    mac: str = ""
    namespace: str = ""
    proxy_name: str = ""
    """The proxy's, for the operator in virsh or virt-manager: in the metadata and the domain's
    ``<title>`` (``services.providers.pure.identity``); never read to decide."""


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    managed: bool
    owner_uid: str
    created_at: datetime
    namespace: str = ""
    proxy_name: str = ""


TEXT_GRAMMAR = Grammar(r"\x20-\x7e", 253)
"""What a namespace or name becomes in the domain XML: printable ASCII (a ``<title>`` must not
hold a newline), at most a DNS subdomain's length."""


def check_vm_name(name: str) -> None:
    """Permanent unless ``name`` can be a domain, a hostname and a volume name prefix."""
    if not VM_NAME.match(name):
        raise Permanent(
            f"instance name {name!r}: use 1-63 letters, digits or '-', starting and ending "
            "with a letter or digit (it becomes the VM's hostname and its volumes' names)"
        )
    if name.startswith(BASE_PREFIX):
        raise Permanent(f"instance name {name!r}: {BASE_PREFIX}* is reserved for cached images")


def mac_for(name: str) -> str:
    """A stable locally administered MAC in QEMU's 52:54:00 range, derived from the VM name:
    a redefined domain keeps its DHCP lease."""
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


def _utc_text(moment: datetime) -> str:
    if moment.tzinfo is None:
        raise ValueError("created_at must be timezone-aware")
    return moment.astimezone(UTC).strftime(_TIME_FORMAT)


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    element = ET.SubElement(parent, tag, attrs)
    if text is not None:
        element.text = text
    return element


def _metadata_element(
    uid: str,
    created_at: datetime,
    prefix: str = "",
    identity: Mapping[str, str] | None = None,
) -> ET.Element:
    """With ``prefix``, literal prefixed names plus their xmlns attribute: ElementTree would
    otherwise invent ns0, and registering the prefix would change a process-wide table.
    ``identity``: the proxy's ``namespace`` and ``name``, each left out when empty."""
    name = f"{prefix}:" if prefix else ""
    attrs = {f"xmlns:{prefix}": METADATA_NS} if prefix else {}
    instance = ET.Element(f"{name}instance", attrs)
    _sub(instance, f"{name}managed", "true")
    _sub(instance, f"{name}uid", uid)
    _sub(instance, f"{name}createdAt", _utc_text(created_at))
    for key, value in (identity or {}).items():
        if value:
            _sub(instance, f"{name}{key}", value)
    return instance


def metadata_fragment(uid: str, created_at: datetime) -> str:
    """The element for ``dom.setMetadata(VIR_DOMAIN_METADATA_ELEMENT, fragment, METADATA_PREFIX,
    METADATA_NS)``: unqualified, because libvirt puts it into the namespace itself and refuses a
    fragment that declares the prefix already. ``dom.metadata()`` returns this same spelling."""
    return ET.tostring(_metadata_element(uid, created_at), encoding="unicode")


def _identity(spec: DomainSpec) -> dict[str, str]:
    found = identity_labels(spec.namespace, spec.proxy_name, TEXT_GRAMMAR)
    return {"namespace": found.get(NAMESPACE_LABEL, ""), "name": found.get(NAME_LABEL, "")}


def _cpu(domain: ET.Element, domain_type: str) -> None:
    if domain_type == "kvm":
        _sub(domain, "cpu", mode="host-passthrough", check="none", migratable="on")
    else:
        # host-passthrough needs KVM: QEMU's `-cpu host` refuses to run under TCG emulation.
        # `maximum` (libvirt 7.1+) gives every feature TCG emulates, x86-64-v2 included, which
        # some distributions require (RHEL 9 and its rebuilds) and QEMU's default qemu64 lacks.
        _sub(domain, "cpu", mode="maximum", check="none", migratable="on")


def domain_xml(spec: DomainSpec) -> str:
    """The domain definition: q35, serial console only, a guest-agent channel for the IP."""
    if spec.mac and not _MAC.match(spec.mac):
        raise ValueError(f"mac {spec.mac!r}: use six lowercase hex pairs, e.g. 52:54:00:12:34:56")
    domain = ET.Element("domain", type=spec.domain_type)
    _sub(domain, "name", spec.name)
    identity = _identity(spec)
    if identity["namespace"] and identity["name"]:
        _sub(domain, "title", f"{identity['namespace']}/{identity['name']}")
    metadata = _metadata_element(spec.owner_uid, spec.created_at, METADATA_PREFIX, identity)
    _sub(domain, "metadata").append(metadata)
    _sub(domain, "memory", str(spec.memory_mib * 1024), unit="KiB")
    _sub(domain, "vcpu", str(spec.vcpus), placement="static")
    os_ = _sub(domain, "os")
    _sub(os_, "type", "hvm", arch="x86_64", machine="q35")
    _sub(os_, "boot", dev="hd")
    features = _sub(domain, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    _cpu(domain, spec.domain_type)
    _sub(domain, "clock", offset="utc")
    _sub(domain, "on_poweroff", "destroy")
    _sub(domain, "on_reboot", "restart")
    _sub(domain, "on_crash", "destroy")
    devices = _sub(domain, "devices")
    disk = _sub(devices, "disk", type="volume", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", pool=spec.pool, volume=spec.disk_volume)
    _sub(disk, "target", dev="vda", bus="virtio")
    seed = _sub(devices, "disk", type="volume", device="cdrom")
    _sub(seed, "driver", name="qemu", type="raw")
    _sub(seed, "source", pool=spec.pool, volume=spec.seed_volume)
    _sub(seed, "target", dev="sda", bus="sata")
    _sub(seed, "readonly")
    nic = _sub(devices, "interface", type="bridge")
    if spec.mac:
        _sub(nic, "mac", address=spec.mac)
    _sub(nic, "source", bridge=spec.bridge)
    _sub(nic, "model", type="virtio")
    _sub(_sub(devices, "serial", type="pty"), "target", port="0")
    _sub(_sub(devices, "console", type="pty"), "target", type="serial", port="0")
    channel = _sub(devices, "channel", type="unix")
    _sub(channel, "target", type="virtio", name=GUEST_AGENT_CHANNEL)
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    ET.indent(domain)
    return ET.tostring(domain, encoding="unicode")


def _child_text(parent: ET.Element, name: str) -> str | None:
    for tag in (f"{{{METADATA_NS}}}{name}", name):
        child = parent.find(tag)
        if child is not None:
            return (child.text or "").strip()
    return None


def parse_metadata(xml: str) -> DomainMetadata | None:
    """Our metadata from a full domain XML or from the fragment ``dom.metadata(..., METADATA_NS)``
    returns. libvirt hands that fragment back with its namespace stripped (``<instance>``); other
    paths keep it, prefixed or as the default namespace. An unqualified element counts only as
    the root, where the caller asked libvirt for our namespace. None when absent or unreadable:
    a domain whose owner and age cannot be read is not one GC may act on."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    ours = f"{{{METADATA_NS}}}instance"
    instance = root if root.tag in (ours, "instance") else next(root.iter(ours), None)
    if instance is None:
        return None
    managed, uid, created = (_child_text(instance, n) for n in ("managed", "uid", "createdAt"))
    if not uid or not created:
        return None
    try:
        created_at = datetime.fromisoformat(created)
    except ValueError:
        return None
    created_at = created_at.replace(tzinfo=UTC) if created_at.tzinfo is None else created_at
    return DomainMetadata(
        managed=managed == "true",
        owner_uid=uid,
        created_at=created_at.astimezone(UTC),
        namespace=_child_text(instance, "namespace") or "",
        proxy_name=_child_text(instance, "name") or "",
    )


def _volume(name: str, capacity_bytes: int, fmt: str) -> tuple[ET.Element, ET.Element]:
    if capacity_bytes <= 0:
        raise ValueError(f"volume {name!r}: capacity must be above 0 bytes")
    volume = ET.Element("volume")
    _sub(volume, "name", name)
    _sub(volume, "capacity", str(capacity_bytes), unit="bytes")
    _sub(volume, "allocation", "0", unit="bytes")
    target = _sub(volume, "target")
    _sub(target, "format", type=fmt)
    return volume, target


def base_volume_xml(name: str, capacity_bytes: int, fmt: str) -> str:
    """A cached image, sized to the download so the upload fills it exactly."""
    volume, _ = _volume(name, capacity_bytes, fmt)
    return ET.tostring(volume, encoding="unicode")


def overlay_volume_xml(
    name: str, capacity_bytes: int, backing_path: str, backing_format: str
) -> str:
    """A VM's disk: a qcow2 overlay on the base, so a VM costs only what it writes."""
    volume, _ = _volume(name, capacity_bytes, "qcow2")
    backing = _sub(volume, "backingStore")
    _sub(backing, "path", backing_path)
    _sub(backing, "format", type=backing_format)
    return ET.tostring(volume, encoding="unicode")


def raw_volume_xml(name: str, capacity_bytes: int) -> str:
    """The seed ISO and the marker: bytes uploaded as they are."""
    volume, _ = _volume(name, capacity_bytes, "raw")
    return ET.tostring(volume, encoding="unicode")


def overlay_name(vm: str) -> str:
    return f"{vm}{OVERLAY_SUFFIX}"


def seed_name(vm: str) -> str:
    return f"{vm}{SEED_SUFFIX}"


def base_name(image: ImageConfig) -> str:
    """Content-addressed: the configured sha256 names the bytes; without one, the URL and
    format name what was downloaded. Either way a changed image is a new volume."""
    if image.sha256:
        return f"{BASE_PREFIX}{image.sha256.lower()[:32]}"
    digest = hashlib.sha256(f"{image.url}\n{image.format}".encode()).hexdigest()
    return f"{BASE_PREFIX}u{digest[:32]}"


def marker_name(base: str) -> str:
    return f"{base}{MARKER_SUFFIX}"


def is_per_vm_volume(vol_name: str) -> str | None:
    """The VM a volume belongs to when it is a reconciler-named VM's disk or seed, else None."""
    for suffix in (SEED_SUFFIX, OVERLAY_SUFFIX):
        if vol_name.endswith(suffix):
            vm = vol_name.removesuffix(suffix)
            return vm if RECONCILER_NAME.match(vm) else None
    return None


def owner_uid_from_name(vm: str) -> str:
    """The owner uid a reconciler-made name carries (lowercased), "" for any other name: what
    lets GC judge a volume left without its domain."""
    match = RECONCILER_NAME.match(vm)
    return match["uid"] if match else ""


def first_routable_ipv4(addresses: Iterable[str]) -> str:
    """The first address a client could reach the proxy at; "" while there is none yet.
    Entries may carry a prefix length (``10.0.0.5/24``); anything unparsable is skipped."""
    for text in addresses:
        try:
            address = ipaddress.ip_interface(text.strip()).ip
        except ValueError:
            continue
        if address.version != 4:
            continue
        if address.is_loopback or address.is_link_local or address.is_unspecified:
            continue
        if address.is_multicast or address.is_reserved:
            continue
        return str(address)
    return ""
