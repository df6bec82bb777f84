"""The gcp entry's preflight against the Compute fake (D140): every check passes for a config
that would work, and each kind of bad config, project or account gives the finding that names
it and its fix, with nothing written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from services.providers.gcp.preflight import PERMISSIONS
from services.providers.gcp.provider import UBUNTU_IMAGE, GcpProvider
from services.providers.preflight import Finding, Preflight, failed, run_preflight
from services.testing.gcp import ComputeFake
from tests.contract.provider import closing
from tests.support.gcp_support import PROJECT, ZONE, config

pytestmark = pytest.mark.integration

REGION = "europe-west1"
CRAWLERS = "203.0.113.0/24"


@pytest.fixture
def fake() -> Iterator[ComputeFake]:
    with ComputeFake(PROJECT) as server:
        yield server


def open_3128(fake: ComputeFake, sources: str = CRAWLERS, tag: str = "egress-proxy") -> None:
    fake.add_firewall("egress-proxy-3128", [("tcp", ["3128"])], [sources], target_tags=[tag])


async def findings_of(fake: ComputeFake, **settings: Any) -> dict[str, Finding]:
    fake.requests.clear()
    async with closing(GcpProvider("gcp-eu", config(fake, **settings))) as provider:
        assert isinstance(provider, Preflight)
        found = await run_preflight(provider)
    writes = {(m, p) for m, p in fake.requests if m != "GET"}
    assert writes <= {("POST", f"/v1/projects/{PROJECT}:testIamPermissions")}
    assert fake.instances == {}
    assert all(f.fix for f in failed(found))
    by_check = {f.check: f for f in found}
    assert len(by_check) == len(found), found
    return by_check


async def test_a_config_that_would_work_passes_every_check(fake: ComputeFake) -> None:
    open_3128(fake)
    found = await findings_of(fake)
    assert list(found) == [
        "credentials",
        "permissions",
        "image",
        f"machineType in {ZONE}",
        f"quota E2_CPUS in {REGION}",
        f"quota INSTANCES in {REGION}",
        f"quota IN_USE_ADDRESSES in {REGION}",
        "firewall",
    ]
    assert failed(list(found.values())) == []
    assert (
        found["permissions"].detail == f"all {len(PERMISSIONS)} a create and the gc need are held"
    )
    assert found["image"].detail == (
        "projects/debian-cloud/global/images/family/debian-12 is debian-12-bookworm-v20251209; "
        "it boots with guest agent only: the script goes in startup-script; a Proxy's cloudInit "
        "must be shell scripts (a #cloud-config is refused)"
    )
    assert found[f"machineType in {ZONE}"].detail == "e2-small is offered (2 vCPUs)"
    assert found[f"quota E2_CPUS in {REGION}"].detail == (
        "E2_CPUS: 0 of 24 used, 24 free, one VM needs 2"
    )
    assert found["firewall"].detail == f"tcp:3128 is opened by egress-proxy-3128 from {CRAWLERS}"


async def test_refused_credentials_are_the_one_finding(fake: ComputeFake) -> None:
    fake.inject(401, "authError", kind="projects")
    found = await findings_of(fake)
    assert list(found) == ["credentials"]
    assert "401" in found["credentials"].detail
    assert "Application Default Credentials" in found["credentials"].fix


async def test_a_wrong_project_id_is_the_one_finding(fake: ComputeFake) -> None:
    found = await findings_of(fake, project="someone-elses")
    assert list(found) == ["credentials"]
    assert "projects/someone-elses' was not found" in found["credentials"].detail
    assert "project id (gcp.project)" in found["credentials"].fix


async def test_missing_permissions_are_named(fake: ComputeFake) -> None:
    open_3128(fake)
    fake.grant(set(PERMISSIONS) - {"compute.instances.create", "compute.disks.create"})
    found = await findings_of(fake)
    assert failed(list(found.values())) == [found["permissions"]]
    assert found["permissions"].detail == (
        f"missing on {PROJECT}: compute.instances.create, compute.disks.create"
    )
    assert "roles/compute.instanceAdmin.v1" in found["permissions"].fix


async def test_permissions_resource_manager_cannot_check_are_said_not_checked(
    fake: ComputeFake,
) -> None:
    open_3128(fake)
    fake.inject(403, "SERVICE_DISABLED", kind="iam")
    found = await findings_of(fake)
    assert found["permissions"].ok
    assert found["permissions"].detail.startswith("not checked:")
    assert "SERVICE_DISABLED" in found["permissions"].detail


async def test_an_image_that_does_not_exist(fake: ComputeFake) -> None:
    open_3128(fake)
    found = await findings_of(fake, image="projects/debian-cloud/global/images/family/debian-99")
    assert failed(list(found.values())) == [found["image"]]
    assert "family/debian-99' was not found" in found["image"].detail
    assert "gcp.image" in found["image"].fix
    ubuntu = await findings_of(fake, image=UBUNTU_IMAGE)
    assert "boots with cloud-init: the script goes in user-data" in ubuntu["image"].detail


async def test_a_machine_type_the_zone_lacks(fake: ComputeFake) -> None:
    open_3128(fake)
    found = await findings_of(fake, machine_type="c3-standard-4")
    finding = found[f"machineType in {ZONE}"]
    assert failed(list(found.values())) == [finding]
    assert finding.detail.endswith("it is offered in europe-west1-d, europe-west4-a, us-central1-a")
    assert "gcp.zone" in finding.fix


async def test_no_zone_means_every_proxy_names_one(fake: ComputeFake) -> None:
    open_3128(fake)
    found = await findings_of(fake, zone="")
    assert failed(list(found.values())) == []
    assert "every Proxy must name spec.placement.zone" in found["zone"].detail
    assert found["machineType"].detail.startswith("e2-small: it is offered in ")


async def test_a_region_without_quota_headroom(fake: ComputeFake) -> None:
    open_3128(fake)
    fake.quota(REGION, "INSTANCES", limit=5, usage=5)
    found = await findings_of(fake)
    finding = found[f"quota INSTANCES in {REGION}"]
    assert failed(list(found.values())) == [finding]
    assert finding.detail == "INSTANCES: 5 of 5 used, 0 free, one VM needs 1"
    assert "higher quota in europe-west1" in finding.fix


async def test_no_rule_opens_the_proxy_port(fake: ComputeFake) -> None:
    found = await findings_of(fake)  # only the default network's own rules
    assert failed(list(found.values())) == [found["firewall"]]
    assert found["firewall"].detail == "no rule of network default opens tcp:3128"
    assert "to tag egress-proxy on network default" in found["firewall"].fix
    open_3128(fake, tag="web")  # a rule for other VMs
    assert not (await findings_of(fake))["firewall"].ok
    open_3128(fake, sources="0.0.0.0/0")
    opened = (await findings_of(fake))["firewall"]
    assert opened.ok
    assert "open to the whole internet" in opened.detail
