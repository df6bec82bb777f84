"""The pure libvirt XML: domain read back element by element and validated against libvirt's
own schema, metadata in every spelling libvirt returns, volumes, and the volume names."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from services.providers.kvm.pure.domain import (
    METADATA_NS,
    METADATA_PREFIX,
    DomainMetadata,
    DomainSpec,
    base_volume_xml,
    domain_xml,
    metadata_fragment,
    overlay_volume_xml,
    parse_metadata,
    raw_volume_xml,
)

UID = "0b6f3c2e-8a41-4d8e-9f7a-2c5d1e3b4a90"
CREATED = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
SHA = "0123456789abcdef" * 4


def spec(**change: object) -> DomainSpec:
    values: dict[str, object] = {
        "name": "px-vm",
        "vcpus": 2,
        "memory_mib": 1536,
        "domain_type": "kvm",
        "pool": "proxies",
        "disk_volume": "px-vm.qcow2",
        "seed_volume": "px-vm-seed.iso",
        "bridge": "br0",
        "owner_uid": UID,
        "created_at": CREATED,
        "mac": "52:54:00:0a:0b:0c",
    } | change
    return DomainSpec(**values)  # type: ignore[arg-type]


def parsed(xml: str) -> ET.Element:
    return ET.fromstring(xml)


def one(root: ET.Element, path: str) -> ET.Element:
    found = root.findall(path)
    assert len(found) == 1, f"{path}: {len(found)} elements"
    return found[0]


# ----------------------------------------------------------------------------- domain


def test_domain_identity_size_and_machine() -> None:
    root = parsed(domain_xml(spec()))
    assert root.tag == "domain"
    assert root.get("type") == "kvm"
    assert one(root, "name").text == "px-vm"
    memory = one(root, "memory")
    assert (memory.get("unit"), memory.text) == ("KiB", str(1536 * 1024))
    assert one(root, "vcpu").text == "2"
    os_type = one(root, "os/type")
    assert (os_type.text, os_type.get("machine"), os_type.get("arch")) == ("hvm", "q35", "x86_64")
    assert one(root, "os/boot").get("dev") == "hd"
    assert one(root, "cpu").get("mode") == "host-passthrough"


def test_emulated_domains_use_a_cpu_tcg_can_run() -> None:
    root = parsed(domain_xml(spec(domain_type="qemu")))
    assert root.get("type") == "qemu"
    assert one(root, "cpu").get("mode") == "maximum"


def test_disks_are_pool_volumes() -> None:
    devices = one(parsed(domain_xml(spec())), "devices")
    disk = one(devices, "disk[@device='disk']")
    assert disk.get("type") == "volume"
    assert one(disk, "driver").attrib == {"name": "qemu", "type": "qcow2", "discard": "unmap"}
    assert one(disk, "source").attrib == {"pool": "proxies", "volume": "px-vm.qcow2"}
    assert one(disk, "target").attrib == {"dev": "vda", "bus": "virtio"}
    cdrom = one(devices, "disk[@device='cdrom']")
    assert cdrom.get("type") == "volume"
    assert one(cdrom, "driver").attrib == {"name": "qemu", "type": "raw"}
    assert one(cdrom, "source").attrib == {"pool": "proxies", "volume": "px-vm-seed.iso"}
    assert one(cdrom, "target").attrib == {"dev": "sda", "bus": "sata"}
    one(cdrom, "readonly")
    assert len(devices.findall("disk")) == 2


def test_bridge_nic_with_virtio_model() -> None:
    devices = one(parsed(domain_xml(spec())), "devices")
    nic = one(devices, "interface")
    assert nic.get("type") == "bridge"
    assert one(nic, "source").attrib == {"bridge": "br0"}
    assert one(nic, "model").attrib == {"type": "virtio"}
    assert one(nic, "mac").attrib == {"address": "52:54:00:0a:0b:0c"}


def test_without_a_mac_libvirt_picks_one() -> None:
    devices = one(parsed(domain_xml(spec(mac=""))), "devices")
    assert one(devices, "interface").find("mac") is None


def test_bad_mac_is_refused() -> None:
    with pytest.raises(ValueError, match="mac"):
        domain_xml(spec(mac="52:54:00:0A:0B"))


def test_console_guest_agent_rng_and_no_graphics() -> None:
    devices = one(parsed(domain_xml(spec())), "devices")
    serial = one(devices, "serial")
    assert (serial.get("type"), one(serial, "target").get("port")) == ("pty", "0")
    console = one(devices, "console")
    assert console.get("type") == "pty"
    assert one(console, "target").attrib == {"type": "serial", "port": "0"}
    channel = one(devices, "channel")
    assert channel.get("type") == "unix"
    assert one(channel, "target").attrib == {"type": "virtio", "name": "org.qemu.guest_agent.0"}
    rng = one(devices, "rng")
    assert rng.get("model") == "virtio"
    backend = one(rng, "backend")
    assert (backend.get("model"), backend.text) == ("random", "/dev/urandom")
    assert devices.find("graphics") is None
    assert devices.find("video") is None


def test_metadata_element_in_our_namespace() -> None:
    xml = domain_xml(spec())
    instance = one(parsed(xml), f"metadata/{{{METADATA_NS}}}instance")
    assert one(instance, f"{{{METADATA_NS}}}managed").text == "true"
    assert one(instance, f"{{{METADATA_NS}}}uid").text == UID
    assert one(instance, f"{{{METADATA_NS}}}createdAt").text == "2026-03-04T05:06:07Z"
    assert f'xmlns:{METADATA_PREFIX}="{METADATA_NS}"' in xml


def test_created_at_is_written_in_utc() -> None:
    local = CREATED.astimezone(timezone(timedelta(hours=-7)))
    assert "<egress:createdAt>2026-03-04T05:06:07Z<" in domain_xml(spec(created_at=local))
    with pytest.raises(ValueError, match="timezone-aware"):
        domain_xml(spec(created_at=datetime(2026, 3, 4)))


def test_names_are_escaped() -> None:
    root = parsed(domain_xml(spec(owner_uid="a<b&c", bridge="br'0\"")))
    assert one(one(root, "devices"), "interface/source").get("bridge") == "br'0\""
    assert parse_metadata(ET.tostring(root, encoding="unicode")) == DomainMetadata(
        True, "a<b&c", CREATED
    )


def virt_xml_validate(tmp_path: Path, xml: str, schema: str) -> None:
    """libvirt's own RelaxNG schema: what ``virsh define`` would accept."""
    tool = shutil.which("virt-xml-validate")
    assert tool, "virt-xml-validate is missing: install libvirt's client tools (libvirt-clients)"
    path = tmp_path / f"{schema}.xml"
    path.write_text(xml)
    result = subprocess.run([tool, str(path), schema], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("domain_type", ["kvm", "qemu"])
def test_domain_is_valid_libvirt_xml(tmp_path: Path, domain_type: str) -> None:
    virt_xml_validate(tmp_path, domain_xml(spec(domain_type=domain_type)), "domain")
    virt_xml_validate(tmp_path, domain_xml(spec(domain_type=domain_type, mac="")), "domain")


def test_the_schema_check_can_fail(tmp_path: Path) -> None:
    broken = domain_xml(spec()).replace('bus="virtio"', 'bus="carrier-pigeon"')
    with pytest.raises(AssertionError):
        virt_xml_validate(tmp_path, broken, "domain")


# ----------------------------------------------------------------------------- metadata

DEFAULT_NS = f"""<instance xmlns="{METADATA_NS}">
  <managed>true</managed><uid>{UID}</uid><createdAt>2026-03-04T05:06:07Z</createdAt>
</instance>"""
OTHER_PREFIX = f"""<x:instance xmlns:x="{METADATA_NS}">
  <x:managed>true</x:managed><x:uid>{UID}</x:uid><x:createdAt>2026-03-04T05:06:07Z</x:createdAt>
</x:instance>"""
EXPECTED = DomainMetadata(managed=True, owner_uid=UID, created_at=CREATED)


def test_metadata_from_full_domain_xml() -> None:
    assert parse_metadata(domain_xml(spec())) == EXPECTED


def test_metadata_fragment_is_unqualified_and_round_trips() -> None:
    fragment = metadata_fragment(UID, CREATED)
    assert fragment.startswith("<instance><managed>true</managed>")
    assert "xmlns" not in fragment
    assert parse_metadata(fragment) == EXPECTED


STRIPPED = f"""<instance>
  <managed>true</managed>
  <uid>{UID}</uid>
  <createdAt>2026-03-04T05:06:07Z</createdAt>
</instance>"""


@pytest.mark.parametrize(
    "xml", [DEFAULT_NS, OTHER_PREFIX, STRIPPED], ids=["default-ns", "other-prefix", "stripped"]
)
def test_metadata_in_the_spellings_libvirt_returns(xml: str) -> None:
    assert parse_metadata(xml) == EXPECTED


@pytest.mark.parametrize("xml", [DEFAULT_NS, OTHER_PREFIX], ids=["default-ns", "other-prefix"])
def test_metadata_inside_a_domain_in_any_namespaced_spelling(xml: str) -> None:
    full = f"<domain type='kvm'><name>x</name><metadata>{xml}</metadata></domain>"
    assert parse_metadata(full) == EXPECTED


def test_metadata_with_unqualified_children() -> None:
    xml = (
        f'<egress:instance xmlns:egress="{METADATA_NS}"><managed>true</managed>'
        f"<uid>{UID}</uid><createdAt>2026-03-04T05:06:07Z</createdAt></egress:instance>"
    )
    assert parse_metadata(xml) == EXPECTED


def test_created_at_is_utc_whatever_the_offset_written() -> None:
    parsed_ = parse_metadata(DEFAULT_NS.replace("05:06:07Z", "07:06:07+02:00"))
    assert parsed_ is not None
    assert parsed_.created_at == CREATED
    assert parsed_.created_at.utcoffset() == timedelta(0)
    naive = parse_metadata(DEFAULT_NS.replace("05:06:07Z", "05:06:07"))
    assert naive is not None
    assert naive.created_at == CREATED
    assert naive.created_at.tzinfo is UTC


def test_managed_false_is_reported_as_such() -> None:
    result = parse_metadata(DEFAULT_NS.replace("<managed>true", "<managed>false"))
    assert result == DomainMetadata(False, UID, CREATED)


@pytest.mark.parametrize(
    "xml",
    [
        "<domain type='kvm'><name>theirs</name></domain>",
        "<domain><metadata><app:vm xmlns:app='https://other.example/'>1</app:vm></metadata></domain>",
        f"<domain><metadata>{STRIPPED}</metadata></domain>",
        STRIPPED.replace("<instance>", "<instance xmlns='https://other.example/'>"),
        DEFAULT_NS.replace(f"<uid>{UID}</uid>", ""),
        DEFAULT_NS.replace("2026-03-04T05:06:07Z", "yesterday"),
        DEFAULT_NS.replace("<createdAt>2026-03-04T05:06:07Z</createdAt>", ""),
        "not xml at all",
        "",
    ],
    ids=[
        "no-metadata",
        "foreign-namespace",
        "unqualified-inside-a-domain",
        "foreign-root",
        "no-uid",
        "bad-time",
        "no-time",
        "garbage",
        "empty",
    ],
)
def test_not_ours_or_unreadable_is_none(xml: str) -> None:
    assert parse_metadata(xml) is None


# ----------------------------------------------------------------------------- volumes


def volume(xml: str) -> ET.Element:
    root = parsed(xml)
    assert root.tag == "volume"
    return root


def test_base_volume() -> None:
    root = volume(base_volume_xml("egress-base-x", 123_456_789, "qcow2"))
    assert one(root, "name").text == "egress-base-x"
    capacity = one(root, "capacity")
    assert (capacity.get("unit"), capacity.text) == ("bytes", "123456789")
    assert one(root, "allocation").get("unit") == "bytes"
    assert one(root, "target/format").get("type") == "qcow2"
    assert root.find("backingStore") is None
    raw = volume(base_volume_xml("egress-base-y", 10, "raw"))
    assert one(raw, "target/format").get("type") == "raw"


def test_overlay_volume_backs_onto_the_base() -> None:
    size = 10 * 1024**3
    root = volume(overlay_volume_xml("px-vm.qcow2", size, "/pool/egress-base-x", "raw"))
    assert one(root, "name").text == "px-vm.qcow2"
    capacity = one(root, "capacity")
    assert (capacity.get("unit"), capacity.text) == ("bytes", str(size))
    assert one(root, "target/format").get("type") == "qcow2"
    assert one(root, "backingStore/path").text == "/pool/egress-base-x"
    assert one(root, "backingStore/format").get("type") == "raw"


def test_raw_volume() -> None:
    root = volume(raw_volume_xml("px-vm-seed.iso", 67_584))
    capacity = one(root, "capacity")
    assert (capacity.get("unit"), capacity.text) == ("bytes", "67584")
    assert one(root, "target/format").get("type") == "raw"


def test_volumes_are_valid_libvirt_xml(tmp_path: Path) -> None:
    virt_xml_validate(tmp_path, base_volume_xml("b", 1024, "qcow2"), "storagevol")
    virt_xml_validate(tmp_path, overlay_volume_xml("o", 1024, "/p/b", "qcow2"), "storagevol")
    virt_xml_validate(tmp_path, raw_volume_xml("s", 1024), "storagevol")


@pytest.mark.parametrize("capacity", [0, -1])
def test_empty_volumes_are_refused(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity"):
        raw_volume_xml("s", capacity)
