"""FakeProvider passes the provider contract, and its test controls do what services rely on."""

from __future__ import annotations

import asyncio

import pytest

from events.schemas import InstanceState
from services.providers.base import (
    CREATED_AT_LABEL,
    NotFound,
    Permanent,
    QuotaExceeded,
    Transient,
)
from services.testing.provider import FakeConfig, FakeProvider
from tests.contract.provider import MakeRequest, ProviderContract, Provoke, request_factory


class TestFakeProviderContract(ProviderContract):
    ready_timeout = 5.0

    @pytest.fixture
    def provider(self) -> FakeProvider:
        return FakeProvider("fake-1", pending_polls=2)

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("fake-1")

    @pytest.fixture
    def provoke(self, provider: FakeProvider, make_request: MakeRequest) -> Provoke:
        provider.inject("create", QuotaExceeded("no capacity"))
        provider.inject("get", Permanent("forbidden"))
        provider.inject("list", Transient("timeout"))
        provider.inject("delete", Transient("reset"))
        return [
            ("create", lambda: provider.create(make_request("e1"))),
            ("get", lambda: provider.get("fake-e1")),
            ("list", provider.list_by_tag),
            ("delete", lambda: provider.delete("fake-e1")),
        ]


@pytest.fixture
def make_request() -> MakeRequest:
    return request_factory("fake")


async def test_pending_for_the_configured_polls_then_running(make_request: MakeRequest) -> None:
    fake = FakeProvider(pending_polls=2, ip_prefix="192.0.2.")
    provider_id = await fake.create(make_request("p"))
    states = [(await fake.get(provider_id)).state for _ in range(3)]
    assert states == [InstanceState.PENDING, InstanceState.PENDING, InstanceState.RUNNING]
    instance = await fake.get(provider_id)
    assert (instance.ip, instance.port) == ("192.0.2.1", 3128)
    assert instance.labels[CREATED_AT_LABEL] == instance.created_at.isoformat()


async def test_replacement_gets_a_new_ip_and_counts_as_a_real_creation(
    make_request: MakeRequest,
) -> None:
    fake = FakeProvider()
    first = await fake.create(make_request("r"))
    await fake.create(make_request("r"))
    ip1 = (await fake.get(first)).ip
    await fake.delete(first)
    second = await fake.create(make_request("r"))
    assert second == first
    assert (await fake.get(second)).ip != ip1
    assert fake.created_total == 2


async def test_injected_errors_are_raised_the_given_number_of_times(
    make_request: MakeRequest,
) -> None:
    fake = FakeProvider()
    fake.inject("create", Transient("blip"), times=2)
    for _ in range(2):
        with pytest.raises(Transient, match="blip"):
            await fake.create(make_request("i"))
    assert await fake.create(make_request("i")) == "fake-i"
    assert fake.created_total == 1
    assert fake.calls == [("create", "i")] * 3
    with pytest.raises(ValueError, match="unknown op"):
        fake.inject("restart", Transient("x"))


async def test_stop_and_vanish_behind_our_back(make_request: MakeRequest) -> None:
    fake = FakeProvider()
    a = await fake.create(make_request("a"))
    b = await fake.create(make_request("b"))
    fake.stop(a)
    stopped = await fake.get(a)
    assert (stopped.state, stopped.ip) == (InstanceState.STOPPED, "")
    fake.vanish(b)
    with pytest.raises(NotFound):
        await fake.get(b)
    assert [i.provider_id for i in await fake.list_by_tag()] == [a]
    with pytest.raises(KeyError):
        fake.stop(b)


async def test_high_water_mark_of_live_instances_per_owner(make_request: MakeRequest) -> None:
    fake = FakeProvider()
    one = await fake.create(make_request("x1", owner_uid="o1"))
    await fake.delete(one)
    two = await fake.create(make_request("x2", owner_uid="o1"))
    await fake.create(make_request("x3", owner_uid="o1"))
    await fake.create(make_request("y1", owner_uid="o2"))
    await fake.delete(two)
    assert fake.max_live_per_owner == {"o1": 2, "o2": 1}
    assert fake.live_per_owner() == {"o1": 1, "o2": 1}


async def test_latency_delays_every_call(make_request: MakeRequest) -> None:
    fake = FakeProvider(latency=0.05)
    task = asyncio.create_task(fake.create(make_request("slow")))
    await asyncio.sleep(0)
    assert not task.done()
    assert fake.instances == {}
    assert await task == "fake-slow"


def test_built_from_a_config_block() -> None:
    fake = FakeProvider.from_config("fake-2", FakeConfig(latency=0.01, pending_polls=3))
    assert (fake.name, fake.type, fake.latency, fake.pending_polls) == ("fake-2", "fake", 0.01, 3)
