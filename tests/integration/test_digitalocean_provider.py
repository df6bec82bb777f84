"""The digitalocean provider through the real ``pydo`` client against a local HTTP fake of the
DigitalOcean API: the shared contract, errors as DigitalOcean sends them (one request each: the
client never retries), what a create sends, what a get and a listing read, and the token."""

from __future__ import annotations

import email.parser
import email.policy
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from events.schemas import InstanceState
from services.providers.base import (
    MANAGED_LABEL,
    OWNER_LABEL,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.cloud.pure.guard import PART_NAME as GUARD_PART
from services.providers.cloud.pure.userdata import PART_NAME
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.providers.squidauth.keyed import lease_keyed
from services.providers.squidauth.pure.cloudinit import PART_NAME as LEASE_PART
from services.testing.digitalocean import LIMIT_MESSAGE, DigitalOceanFake
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
from tests.support.digitalocean_support import CLIENTS, ENTRY, do, fake, provider, request, running
from tests.support.digitalocean_support import provider as _provider

pytestmark = pytest.mark.integration
__all__ = ["do", "fake"]  # fixtures

Call = Callable[[], Awaitable[object]]


# ----------------------------------------------------------------------------- contract


class TestDigitalOceanContract(ProviderContract, CarriesIdentity):
    ready_timeout = 10.0

    @pytest.fixture
    async def provider(self, fake: DigitalOceanFake) -> AsyncIterator[DigitalOceanProvider]:
        async with owned(provider(fake)) as made:
            yield made

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory(ENTRY)

    @pytest.fixture
    async def provoke(
        self, provider: DigitalOceanProvider, fake: DigitalOceanFake, make_request: MakeRequest
    ) -> AsyncIterator[Provoke]:
        slow = _provider(fake, timeout_seconds=0.3)
        wrong = DigitalOceanProvider(ENTRY, provider.config, token="dop_v1_not_the_token")
        bad_image = DigitalOceanProvider(ENTRY, provider.config, token=fake.token)

        def failing(kind: str, status: int, error_id: str, message: str, call: Call) -> Call:
            """Inject right before the call: the calls before it must not meet the fault."""

            async def run() -> object:
                reset = {"ratelimit-reset": str(int(time.time()) + 120)}
                fake.inject(kind, status, error_id, message, headers=reset)
                return await call()

            return run

        yield [
            (
                "droplet limit",
                failing(
                    "droplets.create",
                    422,
                    "unprocessable_entity",
                    LIMIT_MESSAGE,
                    lambda: provider.create(make_request("e1")),
                ),
            ),
            (
                "throttled",
                failing(
                    "droplets.list", 429, "too_many_requests", "Rate limit", provider.list_by_tag
                ),
            ),
            (
                "server error",
                failing("droplets.get", 500, "server_error", "boom", lambda: provider.get("7")),
            ),
            ("unknown image", lambda: bad_image.create(request("e2", image="no-such-image"))),
            ("refused token", lambda: wrong.get("3164444")),
            ("timeout", lambda: _stalled(fake, slow)),
        ]
        for made in (slow, wrong, bad_image):
            await made.close()


async def _stalled(fake: DigitalOceanFake, slow: DigitalOceanProvider) -> object:
    fake.stall("droplets.get", 2.0)
    return await slow.get("3164444")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "answer",
    [
        (422, "unprocessable_entity", LIMIT_MESSAGE, QuotaExceeded),
        (429, "too_many_requests", "API Rate limit exceeded.", Transient),
        (500, "server_error", "Unexpected server-side error", Transient),
        (503, "service_unavailable", "Service Unavailable", Transient),
        (422, "unprocessable_entity", "Droplet already has a pending event.", Transient),
        (401, "Unauthorized", "Unable to authenticate you", Permanent),
        (403, "forbidden", "You do not have access for the attempted action.", Permanent),
        (400, "bad_request", "unparseable", Permanent),
    ],
)
async def test_create_errors_are_classified_after_one_request(
    do: DigitalOceanProvider,
    fake: DigitalOceanFake,
    answer: tuple[int, str, str, type[ProviderError]],
) -> None:
    status, error_id, message, expected = answer
    fake.inject("droplets.create", status, error_id, message, headers={"Retry-After": "3600"})
    with pytest.raises(ProviderError) as caught:
        await do.create(request("px-a"))
    assert type(caught.value) is expected
    assert f"HTTP {status} {error_id}: {message}" in str(caught.value)
    assert isinstance(caught.value.__cause__, Exception)  # the client's error, chained
    assert fake.calls_of("droplets.create") == 1  # no retry by the client, no wait either
    assert fake.droplets == {}
    if expected is not Permanent:
        assert caught.value.retry_after == 3600.0
    if status in (401, 403):
        assert "check DIGITALOCEAN_TOKEN" in str(caught.value)


@pytest.mark.parametrize(
    "kind", ["droplets.get", "droplets.delete", "droplets.list", "firewalls.list", "tags.create"]
)
async def test_every_call_fails_once_without_retrying(
    do: DigitalOceanProvider, fake: DigitalOceanFake, kind: str
) -> None:
    fake.inject(kind, 502, "bad_gateway", "Bad Gateway", times=5)
    calls: dict[str, Call] = {
        "droplets.get": lambda: do.get("3164444"),
        "droplets.delete": lambda: do.delete("3164444"),
        "droplets.list": do.list_by_tag,
        "firewalls.list": lambda: do.create(request("px-b")),
        "tags.create": lambda: do.create(request("px-b")),
    }
    with pytest.raises(Transient, match="HTTP 502 bad_gateway"):
        await calls[kind]()
    assert fake.calls_of(kind) == 1
    assert fake.droplets == {}  # no droplet before its firewall


async def test_throttling_waits_as_long_as_the_reset_header_says(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    reset = int(time.time()) + 900
    fake.inject(
        "droplets.get",
        429,
        "too_many_requests",
        "API Rate limit exceeded.",
        headers={"ratelimit-reset": str(reset), "ratelimit-remaining": "0"},
    )
    with pytest.raises(Transient) as caught:
        await do.get("3164444")
    assert 800.0 < caught.value.retry_after <= 900.0
    # A server error carries the reset header too (every answer does): it asks for no wait.
    fake.inject("droplets.get", 500, "server_error", "boom")
    with pytest.raises(Transient) as caught:
        await do.get("3164444")
    assert caught.value.retry_after == 0.0


@pytest.mark.parametrize(
    ("placement", "said"),
    [
        (
            {"machine_type": "s-64vcpu-1tb"},
            "spec.placement.machineType 's-64vcpu-1tb' is not a DigitalOcean Droplet size",
        ),
        (
            {"region": "xyz9"},
            "DigitalOcean lists no size for xyz9 (the region xyz9 comes from "
            "spec.placement.region)",
        ),
    ],
)
async def test_a_size_or_region_the_catalogue_lacks_is_refused_before_any_write(
    do: DigitalOceanProvider, fake: DigitalOceanFake, placement: dict[str, str], said: str
) -> None:
    with pytest.raises(Permanent) as caught:
        await do.create(request("px-c", **placement))
    assert said in str(caught.value)
    assert (fake.calls_of("droplets.create"), fake.firewalls) == (0, {})


async def test_an_image_digitalocean_does_not_know_is_permanent_naming_the_field(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    with pytest.raises(Permanent) as caught:
        await do.create(request("px-c", image="windows-2022"))
    assert "HTTP 422 unprocessable_entity" in str(caught.value)
    assert "the image 'windows-2022' comes from spec.placement.image" in str(caught.value)
    assert fake.droplets == {}


async def test_a_bad_default_is_named_as_the_config_field(fake: DigitalOceanFake) -> None:
    async with closing(provider(fake, size="s-1vcpu-3gb")) as made:
        with pytest.raises(Permanent, match="size 's-1vcpu-3gb' is not a DigitalOcean"):
            await made.create(request("px-d"))


async def test_a_slow_api_is_a_bounded_transient_failure(fake: DigitalOceanFake) -> None:
    made = provider(fake, timeout_seconds=0.3)
    fake.stall("droplets.get", 2.0)
    try:
        with pytest.raises(Transient, match="timed out"):
            await made.get("3164444")
    finally:
        await made.close()


async def test_an_unreachable_endpoint_is_transient() -> None:
    with DigitalOceanFake() as gone:
        made = provider(gone)
    try:
        with pytest.raises(Transient, match="get droplet 5"):
            await made.get("5")
    finally:
        await made.close()


async def test_ids_it_never_issued_are_not_found_without_a_call(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    for bad in ("px-1", "0", "-3", "3164444/../1", "", "zones/a/instances/b", "9" * 30):
        with pytest.raises(NotFound):
            await do.get(bad)
        await do.delete(bad)
    assert fake.requests == []


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (request("px-e", owner_uid="Owner/With Slash"), "the proxy uid (owner) 'Owner/With Slash'"),
        (request("px-e", owner_uid=""), "the proxy uid (owner) ''"),
        (request("px-e", spec_hash="a b"), "the spec hash 'a b'"),
        (request("px_e"), "not a valid droplet name"),
        (request("px-e", zone="ams3-a"), "DigitalOcean has no zones"),
        (request("px-e", region="Amsterdam"), "spec.placement.region 'Amsterdam'"),
        (request("px-e", machine_type="1 GB"), "spec.placement.machineType '1 GB'"),
        (request("px-e", image="Debian 12"), "spec.placement.image 'Debian 12'"),
        (request("px-e", cloud_init="#cloud-config\n# " + "x" * 70_000), "shorten spec.cloudInit"),
    ],
)
async def test_bad_requests_fail_before_any_call(
    do: DigitalOceanProvider, fake: DigitalOceanFake, bad: object, message: str
) -> None:
    with pytest.raises(Permanent) as caught:
        await do.create(bad)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert fake.requests == []


# ----------------------------------------------------------------------------- what is sent


async def test_a_create_sends_the_placement_tags_and_user_data_with_squid_and_lease_parts(
    fake: DigitalOceanFake,
) -> None:
    made = provider(
        fake,
        "DO-Ams",
        regions=("fra1", "ams3", "lon1"),
        ipv6=True,
        vpc_uuid="5a4981aa-9653-4bd1-bef5-d6bff52042e4",
        ssh_keys=("289794", "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"),
    )
    async with closing(lease_keyed(made, b"k" * 32)) as keyed:
        pid = await keyed.create(request("px-body", cloud_init="#cloud-config\npackages: [htop]\n"))
    (droplet,) = fake.droplets.values()
    sent = droplet.request
    assert str(droplet.body["id"]) == pid
    assert sent["region"] in ("fra1", "ams3", "lon1")
    assert (sent["size"], sent["image"]) == ("s-1vcpu-1gb", "debian-12-x64")
    assert sent["tags"] == [
        "egress-proxies-managed",
        "egress-proxies-provider:do-ams",
        # The proxy's namespace and name, for the console.
        "egress-proxies-namespace:crawl",
        "egress-proxies-name:px-body",
        "egress-proxies-owner:owner-1",
        "egress-proxies-spec:abc123",
    ]
    assert (sent["ipv6"], sent["vpc_uuid"]) == (True, "5a4981aa-9653-4bd1-bef5-d6bff52042e4")
    assert sent["ssh_keys"] == [289794, "3b:16:bf:e4:8b:00:8b:b8:59:8c:a9:d3:f0:19:45:fa"]
    message = email.parser.Parser(policy=email.policy.default).parsestr(sent["user_data"])
    parts = {part.get_filename(): part.get_content() for part in message.iter_parts()}
    assert PART_NAME in parts
    assert LEASE_PART in parts
    assert "http_port 3128" in parts[PART_NAME]
    assert all(cidr in parts[PART_NAME] for cidr in CLIENTS)
    assert any("packages: [htop]" in str(content) for content in parts.values())


async def test_the_region_is_stable_per_name_and_spreads_over_names(fake: DigitalOceanFake) -> None:
    regions = ("fra1", "ams3", "lon1")
    async with closing(provider(fake, regions=regions)) as made:
        for i in range(12):
            await made.create(request(f"px-r{i}"))
        again = provider(fake, regions=regions)
        await again.create(request("px-r0"))  # a retried create: the same droplet, same place
        await again.close()
    used = {d.request["region"] for d in fake.droplets.values()}
    assert len(fake.droplets) == 12
    assert len(used) >= 2
    assert used <= set(regions)


async def test_an_empty_spec_without_squid_gets_only_the_metadata_guard(
    fake: DigitalOceanFake,
) -> None:
    async with closing(provider(fake, install_squid=False)) as made:
        await made.create(request("px-plain"))
    (droplet,) = fake.droplets.values()
    message = email.parser.Parser(policy=email.policy.default).parsestr(
        droplet.request["user_data"]
    )
    assert [part.get_filename() for part in message.iter_parts()] == [GUARD_PART]


# ----------------------------------------------------------------------------- what is read


async def test_states_follow_the_droplet_status(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    pid = await do.create(request("px-s"))
    first, second = await do.get(pid), await do.get(pid)
    assert (first.state, first.ip, first.url) == (InstanceState.PENDING, "", "")
    assert second.state is InstanceState.RUNNING
    assert second.ip.startswith("127.0.1.")
    assert second.url == f"http://{second.ip}:3128"
    fake.power_off(int(pid))
    assert (await do.get(pid)).state is InstanceState.STOPPED
    fake.archive(int(pid))
    with pytest.raises(NotFound, match="archived"):
        await do.get(pid)
    assert await do.list_by_tag() == []
    fake.destroy(int(pid))
    with pytest.raises(NotFound):
        await do.get(pid)
    await do.delete(pid)  # gone already: fine


async def test_instance_fields_come_from_digitalocean(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    pid = await do.create(request("px-f", owner_uid="8d3c7a2e-1f00-4c1b-9d7e-000000000001"))
    await running(do, pid)
    instance = await do.get(pid)
    body = fake.droplets[int(pid)].body
    assert instance.instance_uid == pid == str(body["id"])
    assert instance.created_at.isoformat().startswith(body["created_at"][:19])
    assert (
        instance.labels[OWNER_LABEL] == instance.owner_uid == "8d3c7a2e-1f00-4c1b-9d7e-000000000001"
    )
    assert instance.labels[MANAGED_LABEL] == "true"


async def test_listing_pages_and_sees_only_this_entrys_droplets(fake: DigitalOceanFake) -> None:
    ams = provider(fake, "do-ams", page_size=2)
    fra = provider(fake, "do-fra", regions=("fra1",))
    try:
        ams_ids = {await ams.create(request(f"px-ams-{i}")) for i in range(5)}
        fra_id = await fra.create(request("px-fra-0"))
        fake.put("px-unmanaged", ["web"])
        fake.put("px-unmarked", ["egress-proxies-provider:do-ams"])  # not marked managed
        fake.requests.clear()
        assert {i.provider_id for i in await ams.list_by_tag()} == ams_ids
        pages = [q for m, p, q in fake.requests if p == "/v2/droplets" and m == "GET"]
        assert [q["page"] for q in pages] == ["1", "2", "3"]
        assert all(q["tag_name"] == "egress-proxies-provider:do-ams" for q in pages)
        assert [i.provider_id for i in await fra.list_by_tag()] == [fra_id]
    finally:
        for made in (ams, fra):
            await delete_all(made)
            await made.close()


async def test_a_droplet_an_earlier_attempt_made_is_found_by_name(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    """A create whose answer was lost: the droplet exists, the retry must return it."""
    earlier = fake.put("px-lost", ["egress-proxies-managed", "egress-proxies-provider:do-ams"])
    fake.put("px-lost", ["web"])  # someone else's droplet with the same name
    assert await do.create(request("px-lost")) == str(earlier)
    assert fake.created_total == 0
