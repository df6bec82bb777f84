"""The digitalocean entry's preflight against the local fake (D142): every check passes for a
config that would work, and each kind of bad config or account gives the finding that names it
and its fix, with nothing written to the account."""

from __future__ import annotations

from typing import Any

import pytest

from services.providers.preflight import Finding, Preflight, failed, run_preflight
from services.testing.digitalocean import (
    LIMITED_REGIONS,
    LIMITED_SIZE,
    DigitalOceanFake,
)
from tests.contract.provider import closing
from tests.support.digitalocean_support import fake, provider, request

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # fixtures

WRITES = frozenset({"POST", "PUT", "DELETE", "PATCH"})


async def findings_of(fake: DigitalOceanFake, **settings: Any) -> dict[str, Finding]:
    async with closing(provider(fake, **settings)) as made:
        assert isinstance(made, Preflight)
        found = await run_preflight(made)
    assert not [r for r in fake.requests if r[0] in WRITES]  # read-only, whatever it found
    assert all(f.fix for f in failed(found))
    return {f.check: f for f in found}


async def test_a_config_that_would_work_passes_every_check(fake: DigitalOceanFake) -> None:
    found = await findings_of(fake, regions=("ams3", "lon1"))
    assert list(found) == [
        "credentials",
        "quota",
        "droplets of this entry",
        "image",
        "size in ams3",
        "size in lon1",
        "firewall",
    ]
    assert failed(list(found.values())) == []
    assert found["quota"].detail == "0 of 25 droplets in use: room for 25"
    assert "cloud-init runs the install script" in found["image"].detail
    assert found["size in lon1"].detail == "s-1vcpu-1gb is offered in lon1"
    assert "made at the first create: tcp 3128 in from 198.51.100.0/24" in found["firewall"].detail


async def test_a_size_missing_in_one_region_fails_there_naming_where_it_works(
    fake: DigitalOceanFake,
) -> None:
    found = await findings_of(fake, size=LIMITED_SIZE, regions=("ams3", "lon1"))
    assert found["size in ams3"].ok
    lon = found["size in lon1"]
    assert not lon.ok
    assert f"DigitalOcean offers it in {', '.join(sorted(LIMITED_REGIONS))}" in lon.detail
    assert "such as s-1vcpu-1gb" in lon.detail
    assert (
        lon.fix == "set size to one offered in lon1 (e.g. s-1vcpu-1gb), or drop lon1 from regions"
    )


@pytest.mark.parametrize(
    ("size", "said"),
    [
        ("s-3vcpu-1gb", "is not offered for new Droplets in any region any more"),
        ("s-1vcpu-3gb", "is not a DigitalOcean Droplet size"),
    ],
)
async def test_a_retired_or_unknown_size_fails(
    fake: DigitalOceanFake, size: str, said: str
) -> None:
    finding = (await findings_of(fake, size=size))["size in ams3"]
    assert not finding.ok
    assert f"size '{size}' {said}" in finding.detail


async def test_an_image_it_cannot_find_fails_with_the_slugs_to_use(fake: DigitalOceanFake) -> None:
    finding = (await findings_of(fake, image="centos-6-x64"))["image"]
    assert (finding.ok, finding.detail) == (False, "image 'centos-6-x64' not found")
    assert "debian-12-x64" in finding.fix


async def test_a_refused_token_is_the_only_finding(fake: DigitalOceanFake) -> None:
    found = await findings_of(fake, token="dop_v1_not_the_token")
    assert list(found) == ["credentials"]
    assert "HTTP 401" in found["credentials"].detail
    assert "DIGITALOCEAN_TOKEN" in found["credentials"].fix
    assert "dop_v1_not_the_token" not in found["credentials"].detail


async def test_a_locked_account_fails_its_credentials(fake: DigitalOceanFake) -> None:
    fake.account_status = "locked"
    finding = (await findings_of(fake))["credentials"]
    assert not finding.ok
    assert "the account is locked" in finding.detail


async def test_no_room_under_the_droplet_limit_fails_the_quota(fake: DigitalOceanFake) -> None:
    fake.droplet_limit = 2
    fake.put("web-1", ["web"])
    fake.put("web-2", ["web"])
    finding = (await findings_of(fake))["quota"]
    assert (finding.ok, finding.detail) == (False, "2 of 2 droplets in use: no room left")
    assert "droplet limit" in finding.fix


async def test_an_existing_firewall_that_differs_is_said_to_be_put_right(
    fake: DigitalOceanFake,
) -> None:
    async with closing(provider(fake)) as made:
        await made.create(request("px-a"))
    fake.requests.clear()
    found = await findings_of(fake, proxy_port=8888)
    assert found["firewall"].ok
    assert "exists; its inbound_rules put right at the next create" in found["firewall"].detail
    assert found["droplets of this entry"].detail.startswith("1 droplet(s) carry the tag")


async def test_an_unreadable_catalogue_is_a_finding_not_a_crash(fake: DigitalOceanFake) -> None:
    fake.inject("sizes.list", 500, "server_error", "Unexpected server-side error")
    found = await findings_of(fake)
    assert not found["size catalogue"].ok
    assert "HTTP 500" in found["size catalogue"].detail
    assert found["image"].ok
