"""Volume and VM names (the image cache's content addressing, which volumes are per-VM), the
MAC derived from a name, and picking a VM's address."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.providers.base import Permanent
from services.providers.kvm.pure.config import ImageConfig
from services.providers.kvm.pure.domain import (
    DomainSpec,
    base_name,
    check_vm_name,
    domain_xml,
    first_routable_ipv4,
    is_per_vm_volume,
    mac_for,
    marker_name,
    overlay_name,
    owner_uid_from_name,
    seed_name,
)
from services.reconciler.pure.decision import instance_name

UID = "0b6f3c2e-8a41-4d8e-9f7a-2c5d1e3b4a90"
SHA = "0123456789abcdef" * 4


# ----------------------------------------------------------------------------- names


def test_per_vm_names() -> None:
    assert overlay_name("px-vm") == "px-vm.qcow2"
    assert seed_name("px-vm") == "px-vm-seed.iso"


def test_base_name_is_the_configured_digest() -> None:
    image = ImageConfig(url="https://e.org/debian.qcow2", sha256=SHA)
    assert base_name(image) == f"egress-base-{SHA[:32]}"
    assert marker_name(base_name(image)) == f"egress-base-{SHA[:32]}-sha256"
    moved = ImageConfig(url="https://mirror.lan/debian.qcow2", sha256=SHA)
    assert base_name(moved) == base_name(image), "same bytes, same base"
    changed = ImageConfig(url=image.url, sha256="f" + SHA[1:])
    assert base_name(changed) != base_name(image)


def test_base_name_without_a_digest_follows_url_and_format() -> None:
    image = ImageConfig(url="https://e.org/debian.qcow2")
    name = base_name(image)
    assert name.startswith("egress-base-u")
    assert len(name) == len("egress-base-u") + 32
    assert base_name(ImageConfig(url="https://e.org/debian.qcow2")) == name
    assert base_name(ImageConfig(url="https://e.org/debian-2.qcow2")) != name
    assert base_name(ImageConfig(url=image.url, format="raw")) != name
    assert base_name(ImageConfig(url=image.url, sha256=SHA)) != name


def test_reconciler_names_are_per_vm_volumes() -> None:
    vm = instance_name(UID, "0123456789abcdef")
    check_vm_name(vm)
    assert is_per_vm_volume(overlay_name(vm)) == vm
    assert is_per_vm_volume(seed_name(vm)) == vm
    assert owner_uid_from_name(vm) == UID


@pytest.mark.parametrize(
    "name",
    [
        f"egress-base-{SHA[:32]}",
        f"egress-base-{SHA[:32]}-sha256",
        f"egress-base-u{SHA[:32]}",
        "debian.qcow2",
        "debian-12-seed.iso",
        "px-vm.qcow2",
        "px-0b6f3c2e-0123456.qcow2",
        "px-0b6f3c2e-01234567.img",
        "px-0b6f3c2e-01234567.qcow2.bak",
        "PX-0B6F3C2E-01234567.qcow2",
        "",
    ],
)
def test_other_volumes_are_not_per_vm(name: str) -> None:
    assert is_per_vm_volume(name) is None


def test_owner_uid_only_from_reconciler_names() -> None:
    assert owner_uid_from_name("px-abc-0123abcd") == "abc"
    assert owner_uid_from_name("kvm-test-a") == ""


@pytest.mark.parametrize("name", ["a", "q1", "kvm-test-a", "A" * 63, "px-abc-0123abcd"])
def test_valid_vm_names(name: str) -> None:
    check_vm_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "-a", "a-", "a_b", "a.b", "../escape", "a b", "A" * 64, "egress-base-abc", "é"],
)
def test_invalid_vm_names_are_permanent(name: str) -> None:
    with pytest.raises(Permanent, match="instance name"):
        check_vm_name(name)


def test_mac_for_is_stable_and_local() -> None:
    mac = mac_for("px-vm")
    assert mac == mac_for("px-vm")
    assert mac != mac_for("px-vm2")
    assert mac.startswith("52:54:00:")
    assert len(mac.split(":")) == 6
    spec = DomainSpec(
        name="px-vm",
        vcpus=1,
        memory_mib=512,
        domain_type="kvm",
        pool="default",
        disk_volume="px-vm.qcow2",
        seed_volume="px-vm-seed.iso",
        bridge="br0",
        owner_uid=UID,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        mac=mac,
    )
    assert f'<mac address="{mac}" />' in domain_xml(spec)


# ----------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("addresses", "expected"),
    [
        ([], ""),
        (["192.0.2.10"], "192.0.2.10"),
        (["10.0.0.5/24"], "10.0.0.5"),
        (["127.0.0.1", "::1", "fe80::1", "169.254.1.2", "0.0.0.0", "10.1.2.3"], "10.1.2.3"),
        (["2001:db8::5", "192.168.1.7"], "192.168.1.7"),
        (["garbage", "", "192.168.1.7"], "192.168.1.7"),
        (["224.0.0.1", "255.255.255.255"], ""),
        (["127.0.0.1", "169.254.0.1"], ""),
        (["10.0.0.1", "10.0.0.2"], "10.0.0.1"),
    ],
)
def test_first_routable_ipv4(addresses: list[str], expected: str) -> None:
    assert first_routable_ipv4(addresses) == expected
    assert first_routable_ipv4(iter(addresses)) == expected
