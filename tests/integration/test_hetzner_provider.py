"""The hetzner provider through the real hcloud client against a local HTTP fake of the Hetzner
Cloud API: the shared contract, errors as Hetzner sends them (one request each: no client-side
retry), what a create sends, what a get and a listing read."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from events.schemas import InstanceState, Placement, ProxySpec
from services.providers.base import (
    CREATED_AT_LABEL,
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.userdata import PART_NAME as SQUID_PART
from services.providers.hetzner.provider import HetznerProvider
from services.testing.hetzner import HetznerFake
from tests.contract.provider import (
    CarriesIdentity,
    MakeRequest,
    ProviderContract,
    Provoke,
    closing,
    delete_all,
    owned,
    request_factory,
)
from tests.support.hetzner_support import ENTRY, config, fake, request, user_data_parts

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture


@pytest.fixture
async def hz(fake: HetznerFake) -> AsyncIterator[HetznerProvider]:
    provider = HetznerProvider(ENTRY, config(fake))
    yield provider
    await provider.close()


def server_id(pid: str) -> int:
    return int(pid)


# ----------------------------------------------------------------------------- contract


class TestHetznerContract(ProviderContract, CarriesIdentity):
    ready_timeout = 10.0

    @pytest.fixture
    async def provider(self, fake: HetznerFake) -> AsyncIterator[HetznerProvider]:
        async with owned(HetznerProvider(ENTRY, config(fake))) as provider:
            yield provider

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory(ENTRY, prefix="px-")

    @pytest.fixture
    async def provoke(
        self, provider: HetznerProvider, fake: HetznerFake, make_request: MakeRequest
    ) -> AsyncIterator[Provoke]:
        slow = HetznerProvider(ENTRY, config(fake, timeout_seconds=0.2))
        reset = {"RateLimit-Reset": "4102444800"}
        fake.inject(403, "resource_limit_exceeded", kind="server_create")
        for location in ("fsn1", "nbg1", "hel1"):  # every location listed: a create moves on
            fake.no_room(location)
        fake.inject(429, "rate_limit_exceeded", kind="server_get", headers=reset)
        fake.inject(500, "server_error", kind="server_list")
        fake.inject(403, "forbidden", kind="server_delete")
        fake.stall("firewall_list", 1.0)
        yield [
            ("backend error", provider.list_by_tag),  # first: a create lists names too
            ("project server limit", lambda: provider.create(make_request("e1"))),
            ("no capacity in the location", lambda: provider.create(make_request("e2"))),
            ("throttled", lambda: provider.get("40000099")),
            ("forbidden delete", lambda: provider.delete("40000099")),
            (
                "an image Hetzner does not have",
                lambda: provider.create(request("px-e3", placement=Placement(image="no-such"))),
            ),
            (
                "a location name Hetzner would refuse",
                lambda: provider.create(request("px-e4", placement=Placement(zone="Fsn"))),
            ),
            ("a slow API", slow.leftovers),
        ]
        await slow.close()


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (403, "resource_limit_exceeded", QuotaExceeded),
        (412, "resource_unavailable", QuotaExceeded),
        (412, "placement_error", QuotaExceeded),
        (429, "rate_limit_exceeded", Transient),
        (500, "server_error", Transient),
        (503, "unavailable", Transient),
        (504, "timeout", Transient),
        (502, "bad_gateway", Transient),
        (423, "locked", Transient),
        (409, "conflict", Transient),
        (503, "maintenance", Transient),
        (400, "invalid_input", Permanent),
        (403, "forbidden", Permanent),
        (403, "token_readonly", Permanent),
        (400, "json_error", Permanent),
        (403, "protected", Permanent),
        (422, "unprocessable_thing", Permanent),
        (404, "not_found", Permanent),  # on create: an image, a network, an SSH key
    ],
)
async def test_create_errors_are_classified_after_one_request(
    hz: HetznerProvider,
    fake: HetznerFake,
    status: int,
    code: str,
    expected: type[ProviderError],
) -> None:
    fake.inject(status, code, kind="server_create", message=f"the API says {code}")
    with pytest.raises(ProviderError) as caught:
        # A placed Proxy: a capacity answer is not moved on from (test_hetzner_placement.py).
        await hz.create(request("px-a", placement=Placement(zone="fsn1")))
    assert type(caught.value) is expected
    assert code in str(caught.value)
    assert "the API says" in str(caught.value)
    assert isinstance(caught.value.__cause__, Exception)  # the client's error, chained
    assert fake.calls("server_create") == 1  # hcloud's own retries are off
    assert fake.servers == {}


async def test_a_429_waits_for_one_request_of_the_bucket_and_is_not_retried(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    # The bucket refills one request every 3600/limit seconds; the reset (when it is full
    # again) is up to an hour away and only bounds the wait.
    reset = int(time.time()) + 120
    headers = {"RateLimit-Limit": "360", "RateLimit-Remaining": "0", "RateLimit-Reset": str(reset)}
    fake.inject(429, "rate_limit_exceeded", kind="server_list", headers=headers)
    with pytest.raises(Transient) as caught:
        await hz.list_by_tag()
    assert caught.value.retry_after == pytest.approx(10.0)
    assert fake.calls("server_list") == 1
    fake.inject(429, "rate_limit_exceeded", kind="server_get", headers={"Retry-After": "30"})
    with pytest.raises(Transient) as caught:
        await hz.get("40000001")
    assert caught.value.retry_after == 30.0
    # Every answer carries RateLimit-Reset: on anything but a throttle it is no delay.
    fake.inject(503, "unavailable", kind="server_get")
    with pytest.raises(Transient) as caught:
        await hz.get("40000001")
    assert caught.value.retry_after == 0.0


async def test_a_5xx_without_a_json_error_and_a_502_are_one_request(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    for status, code in ((502, "bad_gateway"), (504, "timeout"), (409, "conflict")):
        before = fake.calls("server_get")
        fake.inject(status, code, kind="server_get")
        with pytest.raises(Transient):
            await hz.get("40000001")
        assert fake.calls("server_get") == before + 1, code


async def test_a_slow_api_is_one_bounded_transient_failure(fake: HetznerFake) -> None:
    provider = HetznerProvider(ENTRY, config(fake, timeout_seconds=0.2))
    fake.stall("server_get", 1.0)
    try:
        with pytest.raises(Transient, match="timed out"):
            await provider.get("40000001")
    finally:
        await provider.close()
    assert fake.calls("server_get") == 1  # hcloud retries timeouts by default: not here


async def test_an_unreachable_endpoint_is_transient(fake: HetznerFake) -> None:
    with HetznerFake() as gone:
        endpoint = gone.url
    async with closing(HetznerProvider(ENTRY, config(fake, endpoint_url=endpoint))) as provider:
        with pytest.raises(Transient, match="ConnectionError"):
            await provider.list_by_tag()


async def test_ids_it_never_issued_are_not_found_without_a_call(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    for bad in ("px-1", "zones/a/instances/b", "0", "-4", "", "1e9"):
        with pytest.raises(NotFound):
            await hz.get(bad)
        await hz.delete(bad)
    assert fake.requests == []


async def test_bad_specs_fail_before_any_call(hz: HetznerProvider, fake: HetznerFake) -> None:
    cases = [
        (request("px_underscore"), "not a valid server name"),
        (request("-px"), "not a valid server name"),
        (request("px-b", placement=Placement(zone="fsn1", region="eu-central")), "differ"),
        (request("px-c", placement=Placement(zone="FSN1")), "spec.placement.zone 'FSN1'"),
        (request("px-d", placement=Placement(machine_type="CX 22")), "machineType"),
        (request("px-e", owner_uid="Owner/With Slash"), "owner-uid='Owner/With Slash'"),
        (request("px-f", owner_uid="-leading-dash"), "not a valid Hetzner label value"),
        (request("px-g", cloud_init="#cloud-config\n" + "x" * 40_000), "at most 32768"),
    ]
    for bad, message in cases:
        with pytest.raises(Permanent, match=message):
            await hz.create(bad)
    assert fake.requests == []


async def test_a_refused_image_or_location_is_permanent_with_hetzners_words(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    with pytest.raises(Permanent, match=r"invalid_input.*\(image: image 'no-such' not found\)"):
        await hz.create(request("px-i", placement=Placement(image="no-such")))
    # A location Hetzner does not have offers no type: the catalogue says so before a create.
    with pytest.raises(Permanent, match=r"spec.placement.zone xyz9; Hetzner offers it in fsn1"):
        await hz.create(request("px-l", placement=Placement(zone="xyz9")))
    assert fake.servers == {}


async def test_a_name_taken_by_a_server_of_someone_else_is_permanent(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    fake.put_server("px-taken", {"team": "search"})
    with pytest.raises(Permanent, match="exists that this provider did not make"):
        await hz.create(request("px-taken"))
    assert fake.calls("server_create") == 0


async def test_a_create_racing_another_process_returns_the_server_that_won(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    labels = {
        MANAGED_LABEL: "true",
        "egress-proxies/provider": ENTRY,
        OWNER_LABEL: "owner-1",
    }
    winner: list[int] = []
    fake.after("server_list", lambda: winner.append(fake.put_server("px-race", labels)))
    assert await hz.create(request("px-race")) == str(winner[0])
    assert fake.calls("server_create") == 1  # refused with uniqueness_error, then looked up
    assert [s.body["name"] for s in fake.servers.values()] == ["px-race"]


async def test_a_delete_already_under_way_is_done(hz: HetznerProvider, fake: HetznerFake) -> None:
    pid = await hz.create(request("px-del"))
    await hz.delete(pid)
    await hz.delete(pid)  # Hetzner answers `locked` while the server is deleting
    with pytest.raises(NotFound):
        await hz.get(pid)
    await hz.delete(pid)
    fake.put_server("px-other", {})
    other = next(iter(fake.servers))
    fake.inject(423, "locked", kind="server_delete")
    with pytest.raises(Transient, match="locked"):  # locked by something else: retry later
        await hz.delete(str(other))


# ----------------------------------------------------------------------------- what is sent


async def test_the_create_request_carries_place_labels_firewall_and_user_data(
    fake: HetznerFake,
) -> None:
    provider = HetznerProvider(
        ENTRY, config(fake, network=4711, ssh_keys=("ops", "123"), ipv6=True, proxy_port=8080)
    )
    placed = CreateRequest(
        name="px-body",
        owner_uid="8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        namespace="crawl",
        proxy_name="p1",
        spec=ProxySpec(
            provider=ENTRY,
            placement=Placement(zone="ash", machine_type="cpx22", image="ubuntu-24.04"),
        ),
        spec_hash="0123456789abcdef",
        cloud_init="#cloud-config\npackages: [htop]\n",
    )
    try:
        pid = await provider.create(placed)
    finally:
        await provider.close()
    (body,) = fake.create_bodies
    assert body["name"] == "px-body"
    assert (body["location"], body["server_type"], body["image"]) == (
        "ash",
        "cpx22",
        "ubuntu-24.04",
    )
    assert body["labels"] == {
        "egress-proxies/managed": "true",
        "egress-proxies/provider": ENTRY,
        "egress-proxies/owner-uid": "8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        "egress-proxies/spec-hash": "0123456789abcdef",
        # The proxy's namespace and name, for the console.
        "egress-proxies/namespace": "crawl",
        "egress-proxies/name": "p1",
    }
    firewall = fake.firewall_named("egress-proxies-hz-eu")
    assert firewall is not None
    assert body["firewalls"] == [{"firewall": firewall["id"]}]
    assert body["public_net"] == {"enable_ipv4": True, "enable_ipv6": True}
    assert body["ssh_keys"] == ["ops", 123]
    assert body["networks"] == [4711]
    assert body["start_after_create"] is True
    parts = user_data_parts(body["user_data"])
    assert list(parts) == ["part-001", GUARD_PART, SQUID_PART]
    assert parts["part-001"] == "#cloud-config\npackages: [htop]\n"
    assert "http_port 8080" in parts[SQUID_PART]
    assert "acl egress_clients src 203.0.113.0/24 2001:db8::/32" in parts[SQUID_PART]
    assert fake.servers[server_id(pid)].body["labels"] == body["labels"]


async def test_defaults_come_from_the_config_and_the_optional_fields_stay_out(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    await hz.create(request("px-plain"))
    (body,) = fake.create_bodies
    assert body["location"] in ("fsn1", "nbg1", "hel1")
    assert (body["server_type"], body["image"]) == ("cx23", "debian-12")
    assert body["public_net"] == {"enable_ipv4": True, "enable_ipv6": False}
    assert "ssh_keys" not in body
    assert "networks" not in body
    assert list(user_data_parts(body["user_data"])) == [GUARD_PART, SQUID_PART]


async def test_install_squid_false_sends_the_proxys_cloud_init_and_the_guard(
    fake: HetznerFake,
) -> None:
    async with closing(HetznerProvider(ENTRY, config(fake, install_squid=False))) as provider:
        await provider.create(request("px-own", cloud_init="#cloud-config\npackages: [squid]\n"))
        await provider.create(request("px-none"))
    own, none = fake.create_bodies
    parts = user_data_parts(own["user_data"])
    assert list(parts) == ["part-001", GUARD_PART]  # the image's Squid gets the rules (D134)
    assert parts["part-001"] == "#cloud-config\npackages: [squid]\n"
    assert list(user_data_parts(none["user_data"])) == [GUARD_PART]


# ----------------------------------------------------------------------------- what is read


async def test_states_follow_hetzners_status(hz: HetznerProvider, fake: HetznerFake) -> None:
    pid = await hz.create(request("px-s"))
    seen = [(await hz.get(pid)).state for _ in range(3)]
    assert seen == [InstanceState.PENDING, InstanceState.RUNNING, InstanceState.RUNNING]
    for status, state in [
        ("starting", InstanceState.PENDING),
        ("migrating", InstanceState.PENDING),
        ("rebuilding", InstanceState.PENDING),
        ("stopping", InstanceState.STOPPED),
        ("unknown", InstanceState.UNKNOWN),
        ("running", InstanceState.RUNNING),
    ]:
        fake.set_status(server_id(pid), status)
        assert (await hz.get(pid)).state is state, status
    fake.power_off(server_id(pid))
    assert (await hz.get(pid)).state is InstanceState.STOPPED
    fake.vanish(server_id(pid))
    with pytest.raises(NotFound):
        await hz.get(pid)


async def test_a_server_without_a_public_ipv4_is_reached_on_its_ipv6(
    hz: HetznerProvider, fake: HetznerFake
) -> None:
    pid = await hz.create(request("px-v6"))
    record = fake.servers[server_id(pid)].body
    record["status"] = "running"
    record["public_net"]["ipv4"] = None
    record["public_net"]["ipv6"] = {
        "id": 9,
        "ip": "2001:db8:7::/64",
        "blocked": False,
        "dns_ptr": [],
    }
    instance = await hz.get(pid)
    assert (instance.state, instance.ip) == (InstanceState.RUNNING, "2001:db8:7::1")
    record["public_net"]["ipv6"] = None
    assert (await hz.get(pid)).state is InstanceState.PENDING  # no address, no proxy


async def test_instance_fields_come_from_hetzner(hz: HetznerProvider, fake: HetznerFake) -> None:
    pid = await hz.create(request("px-f", owner_uid="owner-f"))
    for _ in range(2):
        instance = await hz.get(pid)
    record = fake.servers[server_id(pid)].body
    assert instance.provider_id == instance.instance_uid == str(record["id"])
    assert instance.ip == record["public_net"]["ipv4"]["ip"]
    assert instance.ip.startswith("127.0.1.")
    assert instance.port == 3128
    assert instance.owner_uid == "owner-f"
    assert instance.created_at.utcoffset() is not None
    assert instance.labels[CREATED_AT_LABEL] == instance.created_at.isoformat()
    assert instance.labels[MANAGED_LABEL] == "true"


async def test_listing_pages_and_sees_only_this_entry(fake: HetznerFake) -> None:
    eu = HetznerProvider(ENTRY, config(fake), page_size=2)
    us = HetznerProvider("hz-us", config(fake, locations=("ash",), server_type="cpx22"))
    try:
        eu_ids = {await eu.create(request(f"px-eu-{i}")) for i in range(5)}
        us_id = await us.create(request("px-us-0"))
        fake.put_server("px-unmanaged", {"team": "crawl"})
        fake.put_server("px-other", {MANAGED_LABEL: "true", "egress-proxies/provider": "x"})
        before = fake.calls("server_list")
        assert {i.provider_id for i in await eu.list_by_tag()} == eu_ids
        assert fake.calls("server_list") - before == 3
        assert [i.provider_id for i in await us.list_by_tag()] == [us_id]
    finally:
        await delete_all(eu)
        await delete_all(us)
        await eu.close()
        await us.close()


async def test_get_and_delete_keep_working_after_the_config_changes(fake: HetznerFake) -> None:
    first = HetznerProvider(ENTRY, config(fake, locations=("fsn1",)))
    pid = await first.create(request("px-moved"))
    await first.close()
    async with closing(
        HetznerProvider(ENTRY, config(fake, locations=("hel1",), server_type="cx33"))
    ) as moved:
        assert (await moved.get(pid)).name == "px-moved"
        await moved.delete(pid)
