"""Fixtures of the kvm tests (imported by tests/integration/test_kvm_*.py).

One private libvirtd, one bridge and one set of SSH keys per session (starting them is the slow
part); per test a storage pool of its own, an HTTP image server, and an SSH "hypervisor" in front
of the daemon. Domains use ``domainType: qemu`` (TCG), so no /dev/kvm is needed.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.providers.kvm.provider import KvmProvider, load_credentials
from services.providers.kvm.pure.config import KvmConfig
from tests.contract.provider import delete_all
from tests.support.kvm_daemon import (
    LibvirtDaemon,
    bridge,
    make_qcow2,
    start_daemon,
    stop_daemon,
    storage_pool,
)
from tests.support.kvm_http import ImageServer, image_server
from tests.support.kvm_ssh import Hypervisor, SshKeys, hypervisor
from tests.support.markers import starts

MACHINE = {"vcpus": 1, "memoryMiB": 96}
ConfigFactory = Callable[..., KvmConfig]


class _Shared:
    """One daemon and one bridge for the whole run. Each test module that star-imports these
    fixtures gets its own copy of a session fixture, so the copies share these by count."""

    stack = contextlib.ExitStack()
    daemon: LibvirtDaemon | None = None
    bridge_name = ""
    users = 0


@contextlib.contextmanager
def _shared(factory: pytest.TempPathFactory) -> Iterator[_Shared]:
    if _Shared.users == 0:
        with contextlib.ExitStack() as stack:
            _Shared.bridge_name = stack.enter_context(bridge(f"egt{secrets.token_hex(3)}"))
            _Shared.daemon = start_daemon(factory.mktemp("libvirtd"))
            stack.callback(stop_daemon, _Shared.daemon)  # before the bridge goes
            _Shared.stack = stack.pop_all()
    _Shared.users += 1
    try:
        yield _Shared()
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            _Shared.stack.close()
            _Shared.daemon = None


@pytest.fixture(scope="session")
@starts("libvirtd", marker="kvm")
def libvirtd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LibvirtDaemon]:
    with _shared(tmp_path_factory) as shared:
        assert shared.daemon is not None
        yield shared.daemon


@pytest.fixture(scope="session")
@starts("a network bridge", marker="kvm")
def kvm_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _shared(tmp_path_factory) as shared:
        yield shared.bridge_name


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> SshKeys:
    return SshKeys.create(tmp_path_factory.mktemp("ssh"))


@pytest.fixture(scope="session")
def qcow2(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return make_qcow2(tmp_path_factory.mktemp("image") / "base.qcow2")


@pytest.fixture
def pool(libvirtd: LibvirtDaemon, tmp_path: Path) -> Iterator[str]:
    with storage_pool(libvirtd, tmp_path / "pool") as name:
        yield name


@pytest.fixture
@starts("an HTTP image server")
async def images(qcow2: bytes) -> AsyncIterator[ImageServer]:
    async with image_server(qcow2) as server:
        yield server


@pytest.fixture
@starts("an SSH server in front of libvirtd", marker="kvm")
async def hv(libvirtd: LibvirtDaemon, ssh_keys: SshKeys) -> AsyncIterator[Hypervisor]:
    async with hypervisor(libvirtd.socket, ssh_keys) as host:
        yield host


def host_entry(name: str, host: Hypervisor, bridge_name: str, pool_name: str) -> dict[str, Any]:
    return {
        "name": name,
        "address": host.address,
        "user": "root",
        "bridge": bridge_name,
        "socket": str(host.daemon_socket),
        "pool": pool_name,
    }


@pytest.fixture
def kvm_config(  # noqa: PLR0917 - pytest passes fixtures by parameter name
    tmp_path: Path,
    ssh_keys: SshKeys,
    hv: Hypervisor,
    images: ImageServer,
    kvm_bridge: str,
    pool: str,
) -> ConfigFactory:
    """``kvm_config(**overrides)``: the ``kvm:`` block for one host ``hv1`` behind ``hv``,
    decoded the way the providers config is (camelCase keys)."""

    def make(**overrides: Any) -> KvmConfig:
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(hv.known_hosts())
        block: dict[str, Any] = {
            "sshKeyFile": str(ssh_keys.client_key_file),
            "knownHostsFile": str(known_hosts),
            "domainType": "qemu",
            "diskSizeGb": 1,
            "connectTimeout": 10,
            "keepaliveInterval": 5,
            "images": {"tiny": {"url": images.url("tiny.qcow2"), "sha256": images.sha256}},
            "machineTypes": {"small": MACHINE},
            "hosts": [host_entry("hv1", hv, kvm_bridge, pool)],
        }
        block.update(overrides)
        return msgspec.convert(block, KvmConfig)

    return make


@pytest.fixture
async def provider(kvm_config: ConfigFactory) -> AsyncIterator[KvmProvider]:
    kvm = make_provider(kvm_config())
    yield kvm
    await delete_all(kvm)
    await kvm.close()


def make_provider(config: KvmConfig, **kwargs: float) -> KvmProvider:
    if not kwargs:
        return KvmProvider.from_config("kvm", config)
    return KvmProvider("kvm", config, load_credentials(config), **kwargs)


def trust(config: KvmConfig, known_hosts: str) -> None:
    """Replace the known_hosts file ``config`` names."""
    Path(config.known_hosts_file).write_text(known_hosts)
