"""The kvm provider passes the shared provider contract, on a real libvirtd over real SSH.

VMs boot an empty disk under TCG, so their addresses come from neighbour entries the ARP watcher
writes for each running domain (tests/support/kvm_arp.py) and libvirt's ARP source reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.schemas import Placement, ProxySpec
from services.providers.base import CreateRequest
from services.providers.kvm.provider import KvmProvider
from tests.contract.provider import (
    CarriesIdentity,
    MakeRequest,
    ProviderContract,
    Provoke,
    request_factory,
)
from tests.support.kvm_arp import arp_watcher
from tests.support.kvm_daemon import LibvirtDaemon
from tests.support.kvm_fixtures import *  # noqa: F403  # pytest finds fixtures by name here
from tests.support.kvm_http import ImageServer

pytestmark = [pytest.mark.integration, pytest.mark.kvm]


def _placed(name: str, placement: Placement) -> CreateRequest:
    return CreateRequest(
        name=name,
        owner_uid="owner-p",
        namespace="default",
        proxy_name=name,
        spec=ProxySpec(provider="kvm", placement=placement),
    )


class TestKvmContract(ProviderContract, CarriesIdentity):
    ready_timeout = 90.0

    @pytest.fixture(autouse=True)
    async def addresses(self, libvirtd: LibvirtDaemon, kvm_bridge: str) -> AsyncIterator[None]:
        async with arp_watcher(libvirtd, kvm_bridge):
            yield

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("kvm")

    @pytest.fixture
    def provoke(self, provider: KvmProvider, images: ImageServer) -> Provoke:
        return [
            (
                "a zone that is no host",
                lambda: provider.create(_placed("p1", Placement(zone="nowhere"))),
            ),
            (
                "an image URL that is not there",
                lambda: provider.create(
                    _placed("p2", Placement(image=images.url("missing.qcow2")))
                ),
            ),
            (
                "an image server failing",
                lambda: provider.create(_placed("p3", Placement(image=images.url("busy.qcow2")))),
            ),
            ("a host no longer configured", lambda: provider.get("hosts/gone/domains/p4")),
            (
                "a name that cannot be a hostname",
                lambda: provider.create(_placed("no_underscores", Placement())),
            ),
        ]
