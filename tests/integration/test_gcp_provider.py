"""The gcp provider through the real google-cloud-compute client against a local HTTP fake of the
Compute REST API: the shared contract, errors as GCE sends them, what an insert sends, what a get
and a listing read."""

from __future__ import annotations

import email.parser
import email.policy
from collections.abc import AsyncIterator
from datetime import UTC, datetime

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
from services.providers.gcp.config import GcpConfig
from services.providers.gcp.provider import GcpProvider
from services.testing.gcp import ComputeFake
from services.testing.gcp_catalogue import FakeImage
from tests.contract.provider import (
    CarriesIdentity,
    MakeRequest,
    ProviderContract,
    Provoke,
    delete_all,
    request_factory,
)
from tests.support.gcp_support import PROJECT, ZONE, compute_fake, config, gcp_provider, request  # noqa: F401  # fixtures `fake` and `gcp`

pytestmark = pytest.mark.integration

GOLDEN = f"projects/{PROJECT}/global/images/squid-golden"


# ----------------------------------------------------------------------------- contract


class TestGcpContract(ProviderContract, CarriesIdentity):
    ready_timeout = 10.0

    @pytest.fixture
    async def provider(self, fake: ComputeFake) -> AsyncIterator[GcpProvider]:
        provider = GcpProvider("gcp-eu", config(fake))
        yield provider
        await delete_all(provider)
        await provider.close()

    @pytest.fixture
    def make_request(self) -> MakeRequest:
        return request_factory("gcp-eu")

    @pytest.fixture
    async def provoke(
        self, provider: GcpProvider, fake: ComputeFake, make_request: MakeRequest
    ) -> AsyncIterator[Provoke]:
        no_zone = GcpProvider("gcp-nozone", config(fake, zone=""))
        fake.inject(403, "quotaExceeded", kind="insert")
        fake.inject(403, "forbidden", kind="get")
        fake.inject(503, "backendError", kind="aggregatedList")
        fake.inject(400, "invalid", kind="delete")
        fake.operation_error("ZONE_RESOURCE_POOL_EXHAUSTED")
        yield [
            ("quota refused by the API", lambda: provider.create(make_request("e1"))),
            ("permission denied", lambda: provider.get(f"zones/{ZONE}/instances/e1")),
            ("backend error", provider.list_by_tag),
            ("bad delete", lambda: provider.delete(f"zones/{ZONE}/instances/e1")),
            ("stock-out in the operation", lambda: provider.create(make_request("e2"))),
            ("no zone anywhere", lambda: no_zone.create(make_request("e3"))),
        ]
        await no_zone.close()


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        (403, "quotaExceeded", QuotaExceeded),
        (429, "quotaExceeded", QuotaExceeded),
        (403, "QUOTA_EXCEEDED", QuotaExceeded),
        (503, "ZONE_RESOURCE_POOL_EXHAUSTED", QuotaExceeded),
        (403, "rateLimitExceeded", Transient),
        (429, "rateLimitExceeded", Transient),
        (500, "backendError", Transient),
        (503, "unavailable", Transient),
        (400, "invalid", Permanent),
        (403, "forbidden", Permanent),
        (404, "notFound", Permanent),  # an image or network the insert names is missing
    ],
)
async def test_insert_errors_from_the_api_are_classified(
    gcp: GcpProvider, fake: ComputeFake, status: int, reason: str, expected: type[ProviderError]
) -> None:
    fake.inject(status, reason, kind="insert", message=f"the API says {reason}")
    with pytest.raises(ProviderError) as caught:
        await gcp.create(request("px-a"))
    assert type(caught.value) is expected
    assert reason in str(caught.value)
    assert "the API says" in str(caught.value)
    assert isinstance(caught.value.__cause__, Exception)  # the client's error, chained
    assert fake.instances == {}


async def test_a_409_on_insert_is_the_existing_instance_unless_it_says_otherwise(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    fake.inject(409, "alreadyExists", kind="insert")
    assert await gcp.create(request("px-409")) == f"zones/{ZONE}/instances/px-409"
    assert fake.instances == {}  # nothing was created: the API said it exists
    fake.inject(409, "resourceNotReady", kind="insert")
    with pytest.raises(Transient, match="resourceNotReady"):
        await gcp.create(request("px-409"))


async def test_refused_credentials_are_permanent(gcp: GcpProvider, fake: ComputeFake) -> None:
    fake.inject(401, "authError", kind="insert")
    with pytest.raises(Permanent, match="401: the credentials were refused"):
        await gcp.create(request("px-401"))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", QuotaExceeded),
        ("QUOTA_EXCEEDED", QuotaExceeded),
        ("RESOURCE_OPERATION_RATE_EXCEEDED", Transient),
        ("INVALID_FIELD_VALUE", Permanent),
    ],
)
async def test_an_insert_accepted_but_failed_is_classified_from_its_operation(
    gcp: GcpProvider, fake: ComputeFake, code: str, expected: type[ProviderError]
) -> None:
    fake.operation_error(code, "no e2-small left in europe-west1-b")
    with pytest.raises(expected, match="no e2-small left"):
        await gcp.create(request("px-b"))


async def test_get_and_delete_errors(gcp: GcpProvider, fake: ComputeFake) -> None:
    pid = await gcp.create(request("px-c"))
    fake.inject(503, "backendError", kind="get")
    with pytest.raises(Transient):
        await gcp.get(pid)
    fake.inject(403, "forbidden", kind="delete")
    with pytest.raises(Permanent, match="forbidden"):
        await gcp.delete(pid)
    fake.inject(429, "rateLimitExceeded", kind="aggregatedList")
    with pytest.raises(Transient):
        await gcp.list_by_tag()
    # A 409 on delete is an operation in progress, not "already exists".
    fake.inject(409, "resourceInUseByAnotherResource", kind="delete")
    with pytest.raises(Transient):
        await gcp.delete(pid)
    assert (await gcp.get(pid)).state is InstanceState.PENDING


async def test_a_slow_api_is_a_bounded_transient_failure(fake: ComputeFake) -> None:
    provider = GcpProvider("gcp-eu", config(fake, timeout_seconds=0.2))
    fake.stall("get", 1.0)
    try:
        with pytest.raises(Transient, match="timed out"):
            await provider.get(f"zones/{ZONE}/instances/px-slow")
    finally:
        await provider.close()


async def test_an_unreachable_endpoint_is_transient() -> None:
    with ComputeFake(PROJECT) as gone:
        endpoint = gone.url
    provider = GcpProvider("gcp-eu", GcpConfig(project=PROJECT, zone=ZONE, api_endpoint=endpoint))
    try:
        with pytest.raises(Transient):
            await provider.list_by_tag()
    finally:
        await provider.close()


async def test_ids_it_never_issued_are_not_found_without_a_call(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    for bad in ("px-1", "zones/Europe/instances/x", "zones/a/instances/../b", ""):
        with pytest.raises(NotFound):
            await gcp.get(bad)
        await gcp.delete(bad)
    assert fake.requests == []


async def test_bad_specs_fail_before_any_call(gcp: GcpProvider, fake: ComputeFake) -> None:
    cases = [
        (request("Px-Upper"), "not a valid instance name"),
        (request("px-d", placement=Placement(zone="us-east1-b", region="europe-west1")), "region"),
        (request("px-e", placement=Placement(zone="EU")), "not a zone name"),
        (
            CreateRequest(
                name="px-f",
                owner_uid="Owner/With Slash",
                namespace="crawl",
                proxy_name="f",
                spec=ProxySpec(provider="gcp-eu"),
            ),
            "label value",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(Permanent, match=message):
            await gcp.create(bad)
    assert fake.requests == []


# ----------------------------------------------------------------------------- what is sent


async def test_insert_body_carries_placement_cloud_init_labels_and_one_external_nic(
    fake: ComputeFake,
) -> None:
    fake.add_image(FakeImage(PROJECT, "squid-golden", "squid", cloud_init=True))
    provider = GcpProvider(
        "GCP-EU",
        config(
            fake,
            network="egress-vpc",
            subnetwork="proxies",
            network_tag="egress-proxy",
            disk_size_gb=20,
            service_account="proxy-vm@test-project.iam.gserviceaccount.com",
        ),
    )
    placed = CreateRequest(
        name="px-body",
        owner_uid="8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        namespace="crawl",
        proxy_name="p1",
        spec=ProxySpec(
            provider="GCP-EU",
            placement=Placement(zone="us-east1-c", machine_type="e2-micro", image=GOLDEN),
        ),
        spec_hash="0123456789abcdef",
        cloud_init="#cloud-config\npackages: [squid]\n",
    )
    pid = await provider.create(placed)
    await provider.close()
    assert pid == "zones/us-east1-c/instances/px-body"
    body = fake.instances[("us-east1-c", "px-body")].body
    assert body["machineType"] == "zones/us-east1-c/machineTypes/e2-micro"
    assert body["labels"] == {
        "egress_proxies_managed": "true",
        "egress_proxies_owner_uid": "8d3c7a2e-1f00-4c1b-9d7e-000000000001",
        "egress_proxies_provider": "gcp-eu",
        "egress_proxies_spec_hash": "0123456789abcdef",
        # The proxy's namespace and name, for the console.
        "egress_proxies_namespace": "crawl",
        "egress_proxies_name": "p1",
    }
    # An image of the project's own may run either: both keys (D140).
    user_data, startup = body["metadata"]["items"]
    assert (user_data["key"], startup["key"]) == ("user-data", "startup-script")
    assert fake.ran("us-east1-c", "px-body") == {
        "user-data": user_data["value"],
        "startup-script": startup["value"],
    }
    # The Proxy's own cloud-init, then the guard part with the destination rules (D134).
    parts = email.parser.Parser(policy=email.policy.default).parsestr(user_data["value"])
    got = {str(part.get_filename()): str(part.get_content()) for part in parts.iter_parts()}
    assert list(got) == ["part-001", GUARD_PART]
    assert got["part-001"] == "#cloud-config\npackages: [squid]\n"
    assert "http_access deny egress_to_link_local" in got[GUARD_PART]
    assert body["tags"] == {"items": ["egress-proxy"]}
    (disk,) = body["disks"]
    assert (disk["boot"], disk["autoDelete"]) == (True, True)
    assert disk["initializeParams"] == {"sourceImage": GOLDEN, "diskSizeGb": "20"}
    (nic,) = body["networkInterfaces"]
    assert nic["network"] == "projects/test-project/global/networks/egress-vpc"
    assert nic["subnetwork"] == "regions/us-east1/subnetworks/proxies"
    assert nic["accessConfigs"] == [{"name": "external-nat", "type": "ONE_TO_ONE_NAT"}]
    assert body["serviceAccounts"][0]["email"].startswith("proxy-vm@")
    assert body["description"] == "egress proxy crawl/p1"


async def test_defaults_from_the_config_and_no_optional_fields(
    gcp: GcpProvider, fake: ComputeFake
) -> None:
    await gcp.create(request("px-plain"))
    body = fake.instances[(ZONE, "px-plain")].body
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/e2-small"
    assert body["disks"][0]["initializeParams"]["sourceImage"].endswith("family/debian-12")
    # Even without a cloud-init of its own, the image's Squid gets the guard part (D134), as
    # the startup-script: Debian's guest agent runs nothing else (D140).
    (item,) = body["metadata"]["items"]
    assert item["key"] == "startup-script"
    assert fake.ran(ZONE, "px-plain") == {"startup-script": item["value"]}
    assert GUARD_PART in item["value"]
    assert "serviceAccounts" not in body
    assert "subnetwork" not in body["networkInterfaces"][0]


async def test_get_still_works_after_the_default_zone_changes(fake: ComputeFake) -> None:
    first = GcpProvider("gcp-eu", config(fake, zone="europe-west1-b"))
    pid = await first.create(request("px-moved"))
    await first.close()
    moved = GcpProvider("gcp-eu", config(fake, zone="europe-west4-a"))
    try:
        assert (await moved.get(pid)).name == "px-moved"
        await moved.delete(pid)
    finally:
        await moved.close()


# ----------------------------------------------------------------------------- what is read


async def test_states_follow_gce_status(gcp: GcpProvider, fake: ComputeFake) -> None:
    pid = await gcp.create(request("px-s"))
    seen = [(await gcp.get(pid)).state for _ in range(3)]
    assert seen == [InstanceState.PENDING, InstanceState.PENDING, InstanceState.RUNNING]
    for status, state in [
        ("STOPPING", InstanceState.STOPPED),
        ("TERMINATED", InstanceState.STOPPED),
        ("SUSPENDED", InstanceState.STOPPED),
        ("REPAIRING", InstanceState.PENDING),
        ("RUNNING", InstanceState.RUNNING),
    ]:
        fake.set_status(ZONE, "px-s", status)
        assert (await gcp.get(pid)).state is state, status
    fake.vanish(ZONE, "px-s")
    with pytest.raises(NotFound):
        await gcp.get(pid)


async def test_instance_fields_come_from_gce(gcp: GcpProvider, fake: ComputeFake) -> None:
    pid = await gcp.create(request("px-f"))
    for _ in range(3):
        instance = await gcp.get(pid)
    body = fake.instances[(ZONE, "px-f")].body
    created = datetime.fromisoformat(body["creationTimestamp"])
    assert created.utcoffset() != UTC.utcoffset(None)  # GCE's local offset, converted by us
    assert instance.created_at == created.astimezone(UTC)
    assert instance.instance_uid == body["id"]
    assert instance.ip == body["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    assert instance.labels[MANAGED_LABEL] == "true"
    assert instance.labels[OWNER_LABEL] == "owner-1"
    assert instance.labels[CREATED_AT_LABEL] == instance.created_at.isoformat()


async def test_listing_pages_and_sees_only_this_named_provider(fake: ComputeFake) -> None:
    eu = GcpProvider("gcp-eu", config(fake), page_size=2)
    us = GcpProvider("gcp-us", config(fake, zone="us-east1-b"))
    try:
        eu_ids = {await eu.create(request(f"px-eu-{i}")) for i in range(5)}
        us_id = await us.create(request("px-us-0"))
        fake.put(ZONE, "px-unmanaged", {"team": "crawl"})
        fake.put(
            ZONE, "px-other", {"egress_proxies_managed": "true", "egress_proxies_provider": "x"}
        )
        fake.requests.clear()
        assert {i.provider_id for i in await eu.list_by_tag()} == eu_ids
        pages = [path for method, path in fake.requests if path.endswith("aggregated/instances")]
        assert len(pages) == 3
        assert [i.provider_id for i in await us.list_by_tag()] == [us_id]
    finally:
        await delete_all(eu)
        await delete_all(us)
        await eu.close()
        await us.close()
