"""The ``kvm:`` block: decoding, every start-up rule with the field it names, and placement."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import yaml

from services.providers.base import Permanent
from services.providers.kvm.pure.config import (
    DEFAULT_SOCKET,
    DEFAULT_VENDOR_DATA,
    HostConfig,
    ImageConfig,
    KvmConfig,
    KvmPlacement,
    MachineTypeConfig,
    parse_address,
    resolve_placement,
    validate_kvm_config,
)
from services.runtime.settings.errors import ConfigError

SHA = "0123456789abcdef" * 4
EXAMPLE = f"""
sshKeyFile: /etc/egress/id_ed25519
knownHostsFile: /etc/egress/known_hosts
diskSizeGb: 20
images:
  debian-12:
    url: https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2
    sha256: {SHA}
  raw-one: {{url: "http://mirror.lan/img.raw", format: raw}}
machineTypes:
  small: {{vcpus: 1, memoryMiB: 1024}}
  large: {{vcpus: 4, memoryMiB: 8192}}
hosts:
  - {{name: hv1, address: "hv1.lan:22", user: egress, bridge: br0}}
  - name: hv2
    address: "[2001:db8::10]:2222"
    user: egress
    bridge: br1
    socket: /run/libvirt/libvirt-sock
    pool: proxies
domainType: qemu
connectTimeout: 5
keepaliveInterval: 2.5
"""


def decode(raw: dict[str, Any]) -> KvmConfig:
    return msgspec.convert(raw, KvmConfig)


def base() -> dict[str, Any]:
    """A minimal valid block, as YAML would give it."""
    return {
        "sshKeyFile": "/k",
        "knownHostsFile": "/kh",
        "images": {"debian": {"url": "https://example.org/debian.qcow2"}},
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 512}},
        "hosts": [{"name": "hv1", "address": "hv1.lan:22", "user": "egress", "bridge": "br0"}],
    }


def error_for(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_kvm_config(decode(raw))
    return str(caught.value)


def test_full_example_decodes_every_field() -> None:
    config = decode(yaml.safe_load(EXAMPLE))
    validate_kvm_config(config)
    assert config.ssh_key_file == "/etc/egress/id_ed25519"
    assert config.known_hosts_file == "/etc/egress/known_hosts"
    assert config.insecure_ignore_host_key is False
    assert config.disk_size_gb == 20
    assert config.vendor_data == DEFAULT_VENDOR_DATA
    assert config.images["debian-12"].sha256 == SHA
    assert config.images["debian-12"].format == "qcow2"
    assert config.images["raw-one"] == ImageConfig(url="http://mirror.lan/img.raw", format="raw")
    assert config.machine_types == {
        "small": MachineTypeConfig(vcpus=1, memory_mib=1024),
        "large": MachineTypeConfig(vcpus=4, memory_mib=8192),
    }
    assert config.hosts[0] == HostConfig(
        name="hv1", address="hv1.lan:22", user="egress", bridge="br0"
    )
    assert config.hosts[0].socket == DEFAULT_SOCKET == "/var/run/libvirt/libvirt-sock"
    assert config.hosts[0].pool == "default"
    assert (config.hosts[1].socket, config.hosts[1].pool) == (
        "/run/libvirt/libvirt-sock",
        "proxies",
    )
    assert (config.hosts[1].hostname, config.hosts[1].port) == ("2001:db8::10", 2222)
    assert config.domain_type == "qemu"
    assert (config.connect_timeout, config.keepalive_interval) == (5.0, 2.5)


def test_defaults() -> None:
    config = decode(base())
    validate_kvm_config(config)
    assert config.disk_size_gb == 10
    assert config.domain_type == "kvm"
    assert config.connect_timeout == 30.0
    assert config.keepalive_interval == 15.0
    assert config.insecure_ignore_host_key is False


def test_default_vendor_data_installs_and_starts_the_guest_agent() -> None:
    assert DEFAULT_VENDOR_DATA.startswith("#cloud-config\n")
    data = yaml.safe_load(DEFAULT_VENDOR_DATA)
    assert data["packages"] == ["qemu-guest-agent"]
    assert ["systemctl", "start", "qemu-guest-agent"] in data["runcmd"]


def test_memory_is_spelled_mib_with_a_capital_b() -> None:
    raw = base()
    raw["machineTypes"] = {"small": {"vcpus": 1, "memoryMib": 512}}
    with pytest.raises(msgspec.ValidationError, match="unknown field `memoryMib`"):
        decode(raw)
    raw["machineTypes"] = {"small": {"vcpus": 1}}
    with pytest.raises(msgspec.ValidationError, match="missing required field `memoryMiB`"):
        decode(raw)


def test_unknown_fields_are_refused() -> None:
    raw = base()
    raw["diskSizeGB"] = 5
    with pytest.raises(msgspec.ValidationError, match="diskSizeGB"):
        decode(raw)
    raw = base()
    raw["hosts"][0]["port"] = 22
    with pytest.raises(msgspec.ValidationError, match="port"):
        decode(raw)


def test_ssh_key_file_is_required() -> None:
    raw = base()
    del raw["sshKeyFile"]
    with pytest.raises(msgspec.ValidationError, match="sshKeyFile"):
        decode(raw)
    raw["sshKeyFile"] = ""
    assert "kvm.sshKeyFile is required" in error_for(raw)


def test_known_hosts_is_required_unless_host_keys_are_ignored() -> None:
    raw = base()
    del raw["knownHostsFile"]
    message = error_for(raw)
    assert "kvm.knownHostsFile is required" in message
    assert "insecureIgnoreHostKey" in message
    raw["insecureIgnoreHostKey"] = True
    validate_kvm_config(decode(raw))


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"diskSizeGb": 0}, "kvm.diskSizeGb", "above 0"),
        ({"diskSizeGb": -5}, "kvm.diskSizeGb", "above 0"),
        ({"domainType": "xen"}, "kvm.domainType", "use kvm"),
        ({"connectTimeout": 0}, "kvm.connectTimeout", "above 0"),
        ({"keepaliveInterval": -1}, "kvm.keepaliveInterval", "above 0"),
        ({"machineTypes": {}}, "kvm.machineTypes is empty", "vcpus"),
        ({"hosts": []}, "kvm.hosts is empty", "at least one"),
    ],
)
def test_top_level_rules(change: dict[str, Any], field: str, fix: str) -> None:
    raw = base() | change
    message = error_for(raw)
    assert field in message
    assert fix in message


@pytest.mark.parametrize(
    ("image", "field", "fix"),
    [
        ({"url": "ftp://example.org/x.qcow2"}, "kvm.images.debian.url", "http://"),
        ({"url": "/var/lib/x.qcow2"}, "kvm.images.debian.url", "https://"),
        ({"url": "https://"}, "kvm.images.debian.url", "http"),
        ({"url": "https://e.org/x", "sha256": "abc"}, "kvm.images.debian.sha256", "64 hex"),
        ({"url": "https://e.org/x", "sha256": "g" * 64}, "kvm.images.debian.sha256", "64 hex"),
        ({"url": "https://e.org/x", "sha256": "a" * 65}, "kvm.images.debian.sha256", "64 hex"),
        ({"url": "https://e.org/x", "format": "vmdk"}, "kvm.images.debian.format", "qcow2 or raw"),
    ],
)
def test_image_rules(image: dict[str, str], field: str, fix: str) -> None:
    raw = base()
    raw["images"] = {"debian": image}
    message = error_for(raw)
    assert field in message
    assert fix in message


def test_sha256_is_kept_lowercase_whatever_the_case_written() -> None:
    raw = base()
    raw["images"] = {"debian": {"url": "https://e.org/x", "sha256": SHA.upper()}}
    config = decode(raw)
    validate_kvm_config(config)
    assert config.images["debian"].sha256 == SHA


def test_no_images_is_fine_direct_urls_still_work() -> None:
    raw = base()
    raw["images"] = {}
    validate_kvm_config(decode(raw))


@pytest.mark.parametrize(
    ("machine", "field"),
    [
        ({"vcpus": 0, "memoryMiB": 512}, "kvm.machineTypes.small.vcpus"),
        ({"vcpus": -1, "memoryMiB": 512}, "kvm.machineTypes.small.vcpus"),
        ({"vcpus": 1, "memoryMiB": 0}, "kvm.machineTypes.small.memoryMiB"),
    ],
)
def test_machine_type_rules(machine: dict[str, int], field: str) -> None:
    raw = base()
    raw["machineTypes"] = {"small": machine}
    assert field in error_for(raw)


def host(**change: str) -> dict[str, str]:
    return {"name": "hv2", "address": "hv2.lan:22", "user": "egress", "bridge": "br0"} | change


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"name": ""}, "kvm.hosts[1].name is required", "zone"),
        ({"name": "hv1"}, "kvm.hosts[1].name 'hv1' is already used by kvm.hosts[0]", "own name"),
        ({"user": ""}, "kvm.hosts[1].user is required", "libvirt"),
        ({"bridge": ""}, "kvm.hosts[1].bridge is required", "br0"),
        ({"pool": ""}, "kvm.hosts[1].pool", "default"),
        ({"socket": "libvirt-sock"}, "kvm.hosts[1].socket", "absolute"),
    ],
)
def test_host_rules(change: dict[str, str], field: str, fix: str) -> None:
    raw = base()
    raw["hosts"].append(host(**change))
    message = error_for(raw)
    assert field in message
    assert fix in message


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("hv2.lan", "port is missing"),
        ("hv2.lan:", "port ''"),
        ("hv2.lan:0", "port '0'"),
        ("hv2.lan:65536", "port '65536'"),
        ("hv2.lan:ssh", "port 'ssh'"),
        (":22", "port is missing"),
        ("2001:db8::1:22", "brackets"),
        ("[2001:db8::1]", "brackets and a port"),
        ("[not-v6]:22", "not an IPv6 address"),
        ("hv_2.lan:22", "neither a host name nor an IPv4"),
        ("-hv.lan:22", "neither a host name nor an IPv4"),
        ("999.1.1.1:22", "neither a host name nor an IPv4"),
        ("user@hv2.lan:22", "neither a host name nor an IPv4"),
    ],
)
def test_host_address_rules(address: str, problem: str) -> None:
    raw = base()
    raw["hosts"].append(host(address=address))
    message = error_for(raw)
    assert "kvm.hosts[1].address" in message
    assert problem in message
    assert "host:port" in message


@pytest.mark.parametrize(
    ("address", "hostname", "port"),
    [
        ("hv1.lan:22", "hv1.lan", 22),
        ("hv1:65535", "hv1", 65535),
        ("192.0.2.10:2222", "192.0.2.10", 2222),
        ("[2001:db8::10]:1", "2001:db8::10", 1),
        ("[::1]:22", "::1", 22),
    ],
)
def test_addresses_accepted_and_their_parts(address: str, hostname: str, port: int) -> None:
    assert parse_address(address) == (hostname, port)
    entry = HostConfig(name="h", address=address, user="u", bridge="br0")
    assert (entry.hostname, entry.port) == (hostname, port)


def test_every_problem_is_reported_at_once() -> None:
    raw = base()
    raw["diskSizeGb"] = 0
    raw["hosts"].append(host(name="hv1", address="nope", bridge=""))
    message = error_for(raw)
    for field in ("kvm.diskSizeGb", "kvm.hosts[1].name", "kvm.hosts[1].address", "bridge"):
        assert field in message


# ----------------------------------------------------------------------------- placement


def two_hosts() -> KvmConfig:
    return decode(yaml.safe_load(EXAMPLE))


def test_placement_by_keys() -> None:
    config = two_hosts()
    placement = resolve_placement(config, "hv2", "large", "debian-12")
    assert placement == KvmPlacement(
        host=config.hosts[1],
        machine_type=MachineTypeConfig(vcpus=4, memory_mib=8192),
        image=config.images["debian-12"],
        image_key="debian-12",
    )


def test_placement_by_direct_url() -> None:
    url = "https://images.example.org/ubuntu-24.04.img"
    placement = resolve_placement(two_hosts(), "hv1", "small", url)
    assert placement.image == ImageConfig(url=url, sha256="", format="qcow2")
    assert placement.image_key == url
    assert placement.host.name == "hv1"


def test_empty_fields_mean_the_only_choice() -> None:
    config = decode(base())
    placement = resolve_placement(config, "", "", "")
    assert placement.host == config.hosts[0]
    assert placement.machine_type == config.machine_types["small"]
    assert placement.image_key == "debian"


@pytest.mark.parametrize(
    ("zone", "machine_type", "image", "expected"),
    [
        ("", "small", "debian-12", r"spec\.placement\.zone is empty .* one of: hv1, hv2"),
        ("hv3", "small", "debian-12", r"spec\.placement\.zone 'hv3' .*host.* one of: hv1, hv2"),
        ("hv1", "", "debian-12", r"spec\.placement\.machineType is empty .* large, small"),
        ("hv1", "huge", "debian-12", r"spec\.placement\.machineType 'huge' .* large, small"),
        ("hv1", "small", "", r"spec\.placement\.image is empty .* raw-one or an http\(s\) URL"),
        ("hv1", "small", "ubuntu", r"spec\.placement\.image 'ubuntu' .*debian-12, raw-one or"),
        ("hv1", "small", "ftp://x/y.img", r"spec\.placement\.image 'ftp://x/y\.img'"),
        ("hv1", "small", "/images/y.img", r"spec\.placement\.image '/images/y\.img'"),
    ],
)
def test_placement_naming_nothing_is_permanent(
    zone: str, machine_type: str, image: str, expected: str
) -> None:
    with pytest.raises(Permanent, match=expected):
        resolve_placement(two_hosts(), zone, machine_type, image)


def test_placement_without_configured_images_names_the_url_alternative() -> None:
    raw = base()
    raw["images"] = {}
    with pytest.raises(Permanent, match=r"none configured or an http\(s\) URL"):
        resolve_placement(decode(raw), "", "", "")
