"""Where a Hetzner server goes, against a fake that answers as Hetzner does (D141): a location
without room (412 ``resource_unavailable``) is moved on from, a server type a location does not
offer (400 ``invalid_input`` "unsupported location for server type") is refused from the
catalogue before any create, and the catalogue is read once per type and read again when a
create finds it changed."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hcloud import APIException
from hcloud.images import Image
from hcloud.locations import Location
from hcloud.server_types import ServerType

from events.schemas import Placement
from services.providers.base import Permanent, ProviderError, QuotaExceeded
from services.providers.hetzner.client import build_client, close_client
from services.providers.hetzner.provider import HetznerProvider
from services.providers.hetzner.pure.catalogue import walk
from services.testing.hetzner import HetznerFake
from tests.contract.provider import closing
from tests.support.hetzner_support import ENTRY, config, fake, request

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture

EU = ("fsn1", "nbg1", "hel1")


@pytest.fixture
async def hz(fake: HetznerFake) -> AsyncIterator[HetznerProvider]:
    async with closing(HetznerProvider(ENTRY, config(fake))) as provider:
        yield provider


def sent_locations(fake: HetznerFake) -> list[str]:
    return [body["location"] for body in fake.create_bodies]


# ----------------------------------------------------------------------------- the fake


def test_the_fake_answers_a_type_a_location_lacks_and_a_full_location_as_hetzner_does(
    fake: HetznerFake,
) -> None:
    """Through the real client: what the provider's tests below rely on the fake to say."""
    client = build_client(config(fake))
    try:

        def create(location: str, server_type: str = "cx23") -> APIException:
            with pytest.raises(APIException) as caught:
                client.servers.create(
                    name=f"px-{location}",
                    server_type=ServerType(name=server_type),
                    image=Image(name="debian-12"),
                    location=Location(name=location),
                )
            return caught.value

        refused = create("ash")
        assert (refused.code, refused.message) == (
            "invalid_input",
            "unsupported location for server type",
        )
        fake.no_room("hel1", "server location disabled")
        full = create("hel1")
        assert (full.code, full.message) == ("resource_unavailable", "server location disabled")
        fake.set_offer("cpx22", "sin", available=False)
        sold_out = create("sin", "cpx22")
        assert (sold_out.code, sold_out.message) == (
            "resource_unavailable",
            "error during placement",
        )
        cx23 = client.server_types.get_by_name("cx23")
        assert cx23 is not None
        assert [entry.location.data_model.name for entry in cx23.locations or []] == list(EU)
        assert [price["location"] for price in cx23.prices or []] == list(EU)
    finally:
        close_client(client)
    assert fake.servers == {}


# ----------------------------------------------------------------------------- capacity


async def test_a_location_without_room_is_moved_on_from_in_the_lists_order(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    order = walk(EU, "px-full")
    fake.no_room(order[0])
    pid = await hz.create(request("px-full"))
    assert sent_locations(fake) == order[:2]
    assert fake.servers[int(pid)].body["location"]["name"] == order[1]


async def test_moving_on_keeps_a_create_idempotent_on_its_name(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    order = walk(EU, "px-again")
    fake.no_room(order[0])
    first = await hz.create(request("px-again"))
    fake.room(order[0])  # the next attempt would start there: the name is found first
    assert await hz.create(request("px-again")) == first
    assert fake.calls("server_create") == 2  # the refused one and the one that made it
    assert len(fake.servers) == 1


async def test_no_room_anywhere_is_quota_exceeded_naming_every_location_tried(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    for location in EU:
        fake.no_room(location, f"no room in {location}")
    with pytest.raises(QuotaExceeded) as caught:
        await hz.create(request("px-none"))
    order = walk(EU, "px-none")
    assert sent_locations(fake) == order
    message = str(caught.value)
    assert (
        "tried in this order: "
        + ", ".join(
            f"{location} (resource_unavailable: no room in {location})" for location in order
        )
        in message
    )
    assert "list more locations" in message
    assert isinstance(caught.value.__cause__, ProviderError)
    assert fake.servers == {}


async def test_a_placed_proxy_is_not_moved_and_the_project_limit_is_not_a_location(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    fake.no_room("nbg1")
    with pytest.raises(QuotaExceeded, match=r"spec.placement.zone nbg1 \(resource_unavail"):
        await hz.create(request("px-placed", placement=Placement(zone="nbg1")))
    assert sent_locations(fake) == ["nbg1"]
    fake.room("nbg1")
    # The project's server limit holds in every location: one request, no walk.
    fake.inject(403, "resource_limit_exceeded", kind="server_create")
    with pytest.raises(QuotaExceeded, match="resource_limit_exceeded"):
        await hz.create(request("px-limit"))
    assert fake.calls("server_create") == 2


# ----------------------------------------------------------------------------- the catalogue


async def test_a_type_one_listed_location_lacks_is_permanent_for_every_name_before_a_create(
    fake: HetznerFake,
) -> None:
    async with closing(HetznerProvider(ENTRY, config(fake, locations=("fsn1", "ash")))) as hz:
        for name in ("px-a", "px-b", "px-c", "px-d"):  # some hash to fsn1, some to ash
            with pytest.raises(Permanent) as caught:
                await hz.create(request(name))
            assert str(caught.value).endswith(
                "serverType cx23 is not offered in ash (listed in locations); Hetzner offers "
                "it in fsn1, nbg1, hel1: list only locations that offer it, or set serverType "
                "to a type offered in every location listed"
            )
    assert fake.calls("server_create") == 0
    assert fake.calls("server_type_list") == 1  # cached


async def test_a_proxys_own_type_and_place_are_checked_naming_its_fields(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    placed = Placement(zone="hil", machine_type="cax11")
    with pytest.raises(Permanent, match=r"spec.placement.machineType cax11 is not offered in "):
        await hz.create(request("px-arm", placement=placed))
    with pytest.raises(Permanent, match=r"spec.placement.machineType 'cx99': Hetzner has no"):
        await hz.create(request("px-typo", placement=Placement(machine_type="cx99")))
    assert fake.calls("server_create") == 0
    await hz.create(request("px-us", placement=Placement(zone="hil", machine_type="cpx22")))
    assert sent_locations(fake) == ["hil"]


async def test_a_deprecation_past_its_end_is_no_offer(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    fake.set_offer("cx23", "hel1", ends="2025-06-01T00:00:00+00:00")
    with pytest.raises(Permanent, match=r"not offered in hel1 .*offers it in fsn1, nbg1:"):
        await hz.create(request("px-old"))
    assert fake.calls("server_create") == 0


async def test_a_changed_catalogue_met_by_a_create_is_read_again(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    name = next(n for n in (f"px-{i}" for i in range(50)) if walk(EU, n)[0] == "fsn1")
    await hz.create(request(name))
    assert fake.calls("server_type_list") == 1
    fake.withdraw("cx23", "fsn1")  # the cache still says fsn1 offers it
    later = next(n for n in (f"px-{i}" for i in range(50, 100)) if walk(EU, n)[0] == "fsn1")
    with pytest.raises(Permanent, match="unsupported location for server type"):
        await hz.create(request(later))
    with pytest.raises(Permanent, match=r"not offered in fsn1 .*offers it in nbg1, hel1"):
        await hz.create(request(later))
    assert fake.calls("server_type_list") == 2
    assert fake.calls("server_create") == 2
