"""The kvm provider's SSH transport against real asyncssh servers in front of a real libvirtd:
host-key and client-key checks, deadlines that release hung calls, one shared dial, redials,
keepalives, independent hosts, and the start-up checks of the config."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from services.providers.base import NotFound, Permanent, Transient
from services.providers.config import build_providers, parse_providers_config
from services.providers.kvm.provider import KvmProvider
from services.runtime.settings.errors import ConfigError
from tests.support.kvm_daemon import LibvirtDaemon
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.kvm_fixtures import ConfigFactory, host_entry, make_provider, trust
from tests.support.kvm_ssh import FreezableProxy, Hypervisor, SshKeys, hypervisor, silent_server
from tests.support.waiting import until

pytestmark = [pytest.mark.integration, pytest.mark.kvm]

ABSENT = "hosts/hv1/domains/absent"
WAIT = 30.0


@contextlib.asynccontextmanager
async def closing(kvm: KvmProvider) -> AsyncIterator[KvmProvider]:
    try:
        yield kvm
    finally:
        await kvm.close()


# ----------------------------------------------------------------------------- keys


async def test_a_host_key_mismatch_is_rejected_with_a_clear_message(
    kvm_config: ConfigFactory, hv: Hypervisor, tmp_path: Path
) -> None:
    config = kvm_config()
    trust(config, hv.known_hosts(asyncssh.generate_private_key("ssh-ed25519")))
    async with closing(make_provider(config)) as kvm:
        with pytest.raises(Transient, match="host key is not trusted") as caught:
            await kvm.get(ABSENT)
        assert "knownHostsFile" in str(caught.value)
        assert not hv.connections or all(c.is_closed() for c in hv.connections)


async def test_insecure_ignore_host_key_trusts_any_key(
    kvm_config: ConfigFactory, hv: Hypervisor
) -> None:
    config = kvm_config(knownHostsFile="", insecureIgnoreHostKey=True)
    async with closing(make_provider(config)) as kvm:
        with pytest.raises(NotFound):
            await kvm.get(ABSENT)


async def test_a_client_key_the_host_does_not_accept_is_rejected(
    kvm_config: ConfigFactory, libvirtd: LibvirtDaemon, ssh_keys: SshKeys, tmp_path: Path
) -> None:
    other = asyncssh.generate_private_key("ssh-ed25519")
    async with hypervisor(libvirtd.socket, ssh_keys, accepted_key=other) as picky:
        config = kvm_config(hosts=[host_entry("hv1", picky, "br-unused", "default")])
        trust(config, picky.known_hosts())
        async with closing(make_provider(config)) as kvm:
            with pytest.raises(Transient, match="refused our key") as caught:
                await kvm.get(ABSENT)
            assert "authorized_keys" in str(caught.value)


# ----------------------------------------------------------------------------- deadlines


async def test_a_hung_call_is_released_by_its_deadline_and_the_host_redialed(
    kvm_config: ConfigFactory, hv: Hypervisor
) -> None:
    async with closing(make_provider(kvm_config(), call_timeout=2.0)) as kvm:
        with pytest.raises(NotFound):
            await kvm.get(ABSENT)
        assert len(hv.connections) == 1
        hv.paused = True
        with pytest.raises(Transient, match="no answer within"):
            await kvm.get(ABSENT)
        assert not kvm.transports["hv1"].connected
        # The thread blocked in libvirt returned: its connection was closed under it.
        await until(
            lambda: kvm.transports["hv1"].calls_in_flight == 0, WAIT, what="thread released"
        )
        hv.paused = False
        with pytest.raises(NotFound):
            await kvm.get(ABSENT)
        assert len(hv.connections) == 2


async def test_a_host_that_never_answers_libvirt_fails_the_dial(
    kvm_config: ConfigFactory, hv: Hypervisor
) -> None:
    hv.paused = True
    config = kvm_config(connectTimeout=2)
    async with closing(make_provider(config, call_timeout=30.0)) as kvm:
        with pytest.raises(Transient, match="cannot open libvirt"):
            await kvm.get(ABSENT)
        hv.paused = False
        with pytest.raises(NotFound):
            await kvm.get(ABSENT)


async def test_a_silent_ssh_port_is_bounded_by_the_connect_timeout(
    kvm_config: ConfigFactory, kvm_bridge: str, pool: str
) -> None:
    async with silent_server() as port:
        host = {"name": "hv1", "address": f"127.0.0.1:{port}", "user": "root"}
        config = kvm_config(connectTimeout=1, hosts=[{**host, "bridge": kvm_bridge}])
        async with closing(make_provider(config, call_timeout=30.0)) as kvm:
            with pytest.raises(Transient, match="cannot connect"):
                await kvm.get(ABSENT)


# ----------------------------------------------------------------------------- links


async def test_concurrent_callers_share_one_dial(kvm_config: ConfigFactory, hv: Hypervisor) -> None:
    async with closing(make_provider(kvm_config())) as kvm:
        results = await asyncio.gather(
            *(kvm.get(f"hosts/hv1/domains/absent-{i}") for i in range(6)),
            return_exceptions=True,
        )
        assert all(isinstance(r, NotFound) for r in results), results
        assert len(hv.connections) == 1


async def test_a_dropped_connection_is_redialed(kvm_config: ConfigFactory, hv: Hypervisor) -> None:
    async with closing(make_provider(kvm_config())) as kvm:
        assert await kvm.list_by_tag() == []
        hv.drop_connections()
        await until(lambda: not kvm.transports["hv1"].connected, WAIT, what="disconnected")
        assert await kvm.list_by_tag() == []
        assert len(hv.connections) == 2


async def test_keepalives_notice_a_dead_link(
    kvm_config: ConfigFactory, hv: Hypervisor, kvm_bridge: str, pool: str
) -> None:
    proxy = await FreezableProxy(hv.port).start()
    try:
        moved = {**host_entry("hv1", hv, kvm_bridge, pool), "address": proxy.address}
        config = kvm_config(keepaliveInterval=0.5, hosts=[moved])
        trust(config, hv.known_hosts().replace(f":{hv.port} ", f":{proxy.port} "))
        async with closing(make_provider(config)) as kvm:
            with pytest.raises(NotFound):
                await kvm.get(ABSENT)
            assert kvm.transports["hv1"].connected
            proxy.frozen = True
            # No call is running: only the keepalives can notice.
            await until(
                lambda: not kvm.transports["hv1"].connected, WAIT, what="disconnected by keepalives"
            )
    finally:
        await proxy.close()


async def test_hosts_are_independent(
    kvm_config: ConfigFactory, hv: Hypervisor, kvm_bridge: str, pool: str
) -> None:
    async with silent_server() as port:
        good = host_entry("good", hv, kvm_bridge, pool)
        hung = {"name": "hung", "address": f"127.0.0.1:{port}", "user": "root"}
        config = kvm_config(connectTimeout=60, hosts=[good, {**hung, "bridge": kvm_bridge}])
        async with closing(make_provider(config, call_timeout=120.0)) as kvm:
            stuck = asyncio.create_task(kvm.get("hosts/hung/domains/x"))
            await asyncio.sleep(0)
            for _ in range(3):
                with pytest.raises(NotFound):
                    await kvm.get("hosts/good/domains/x")
            assert not stuck.done()
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck


async def test_a_host_hung_mid_call_does_not_hold_up_another(  # noqa: PLR0917 - fixtures
    kvm_config: ConfigFactory,
    hv: Hypervisor,
    libvirtd: LibvirtDaemon,
    ssh_keys: SshKeys,
    kvm_bridge: str,
    pool: str,
) -> None:
    async with hypervisor(libvirtd.socket, ssh_keys) as other:
        hosts = [host_entry("a", hv, kvm_bridge, pool), host_entry("b", other, kvm_bridge, pool)]
        config = kvm_config(hosts=hosts)
        trust(config, hv.known_hosts() + other.known_hosts())
        async with closing(make_provider(config, call_timeout=120.0)) as kvm:
            for host in ("a", "b"):
                with pytest.raises(NotFound):
                    await kvm.get(f"hosts/{host}/domains/x")
            hv.paused = True
            stuck = asyncio.create_task(kvm.get("hosts/a/domains/x"))
            await until(
                lambda: kvm.transports["a"].calls_in_flight, WAIT, what="a call in flight on a"
            )
            for _ in range(3):
                with pytest.raises(NotFound):
                    await kvm.get("hosts/b/domains/x")
            assert not stuck.done()
            stuck.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
            # Giving up closed the connection under the call, so its thread is free again.
            await until(
                lambda: kvm.transports["a"].calls_in_flight == 0, WAIT, what="thread released"
            )
            assert kvm.transports["b"].connected


async def test_an_unreachable_host_fails_the_whole_listing(
    kvm_config: ConfigFactory, hv: Hypervisor, kvm_bridge: str, pool: str
) -> None:
    async with silent_server() as port:
        pass  # the port is closed again: connections are refused
    good = host_entry("good", hv, kvm_bridge, pool)
    down = {"name": "down", "address": f"127.0.0.1:{port}", "user": "root", "bridge": kvm_bridge}
    async with closing(make_provider(kvm_config(hosts=[good, down]))) as kvm:
        with pytest.raises(Transient, match=r"down: ssh root@127\.0\.0\.1"):
            await kvm.list_by_tag()


async def test_provider_ids_on_unknown_hosts(kvm_config: ConfigFactory) -> None:
    async with closing(make_provider(kvm_config())) as kvm:
        with pytest.raises(Permanent, match="no longer in the kvm config"):
            await kvm.get("hosts/gone/domains/x")
        with pytest.raises(Permanent, match="no longer in the kvm config"):
            await kvm.delete("hosts/gone/domains/x")
        with pytest.raises(NotFound):
            await kvm.get("not-a-kvm-id")
        await kvm.delete("not-a-kvm-id")


# ----------------------------------------------------------------------------- config


def test_unreadable_key_files_are_config_errors(kvm_config: ConfigFactory, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kvm\.sshKeyFile .*cannot read"):
        KvmProvider.from_config("kvm", kvm_config(sshKeyFile=str(tmp_path / "nope")))
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key\n")
    with pytest.raises(ConfigError, match=r"kvm\.sshKeyFile .*not a usable private key"):
        KvmProvider.from_config("kvm", kvm_config(sshKeyFile=str(garbage)))
    with pytest.raises(ConfigError, match=r"kvm\.knownHostsFile .*cannot read"):
        KvmProvider.from_config("kvm", kvm_config(knownHostsFile=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match=r"kvm\.knownHostsFile is required"):
        KvmProvider.from_config("kvm", kvm_config(knownHostsFile=""))


async def test_the_kvm_type_is_registered(kvm_config: ConfigFactory, tmp_path: Path) -> None:
    config = kvm_config()
    block = {
        "sshKeyFile": config.ssh_key_file,
        "knownHostsFile": config.known_hosts_file,
        "machineTypes": {"small": {"vcpus": 1, "memoryMiB": 96}},
        "hosts": [
            {"name": h.name, "address": h.address, "user": h.user, "bridge": h.bridge}
            for h in config.hosts
        ],
    }
    entries = parse_providers_config(
        {"providers": [{"name": "home", "type": "kvm", "kvm": block}]},
        source="test",
        base_dir=tmp_path,
        default_data_dir=tmp_path,
    )
    providers = build_providers(entries)
    kvm = providers["home"]
    assert isinstance(kvm, KvmProvider)
    assert kvm.config.hosts[0].socket == "/var/run/libvirt/libvirt-sock"
    await kvm.close()
