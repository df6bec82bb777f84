"""The hetzner preflight against the fake: a good entry, then each kind of bad one, each named
with its fix; and that it only reads (D141)."""

from __future__ import annotations

from typing import Any

import pytest

from services.providers.hetzner.provider import HetznerProvider
from services.providers.preflight import Finding, Preflight, failed, run_preflight
from services.testing.hetzner import HetznerFake
from tests.contract.provider import closing
from tests.support.hetzner_support import CLIENTS, ENTRY, config, fake

pytestmark = pytest.mark.integration
__all__ = ["fake"]  # a fixture


async def findings(fake: HetznerFake, **overrides: Any) -> dict[str, Finding]:
    async with closing(HetznerProvider(ENTRY, config(fake, **overrides))) as provider:
        assert isinstance(provider, Preflight)
        found = await run_preflight(provider)
    by_check = {f.check: f for f in found}
    assert len(by_check) == len(found), found  # one finding per check
    return by_check


async def test_a_good_entry_passes_every_check_and_only_reads(fake: HetznerFake) -> None:
    found = await findings(fake)
    assert list(found) == [
        "credentials",
        "size in fsn1",
        "size in nbg1",
        "size in hel1",
        "image",
        "firewall",
        "quota",
    ]
    assert failed(list(found.values())) == []
    assert "the entry has 0 servers" in found["credentials"].detail
    assert found["size in nbg1"].detail == "cx23 is offered in nbg1, 4.1531 EUR a month gross"
    assert found["image"].detail.startswith("debian-12 (id 114690387, system image, debian 12)")
    assert "known to run the Squid part" in found["image"].detail
    assert found["firewall"].detail == (
        f"egress-proxies-{ENTRY} does not exist yet: the first create makes it, allowing "
        f"inbound TCP 3128 from {', '.join(sorted(CLIENTS))} only"
    )
    assert "no quota endpoint" in found["quota"].detail
    assert {method for method, _, _ in fake.requests} == {"GET"}
    assert fake.firewalls == {}
    assert fake.servers == {}


async def test_a_refused_token_is_the_one_finding_with_where_to_put_one(
    fake: HetznerFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCLOUD_TOKEN", "hzWRONGtoken")
    found = await findings(fake)
    assert list(found) == ["credentials"]
    assert not found["credentials"].ok
    assert "unauthorized" in found["credentials"].detail
    assert found["credentials"].fix == (
        "put a Read & Write API token of the servers' project in HCLOUD_TOKEN"
    )
    assert "hzWRONGtoken" not in repr(found)
    monkeypatch.delenv("HCLOUD_TOKEN")
    before = len(fake.requests)
    found = await findings(fake)
    assert list(found) == ["credentials"]
    assert "no Hetzner Cloud API token" in found["credentials"].detail
    assert len(fake.requests) == before  # nothing to send


async def test_an_unreachable_api_says_to_check_the_route(fake: HetznerFake) -> None:
    with HetznerFake() as gone:
        endpoint = gone.url
    found = await findings(fake, endpoint_url=endpoint)
    assert list(found) == ["credentials"]
    assert found["credentials"].fix.startswith(f"check that this machine reaches {endpoint}/v1")


async def test_a_type_a_location_lacks_and_an_unknown_type(fake: HetznerFake) -> None:
    found = await findings(fake, locations=("fsn1", "ash"))
    assert found["size in fsn1"].ok
    assert not found["size in ash"].ok
    assert found["size in ash"].detail == (
        "cx23 is not offered in ash; Hetzner offers it in fsn1, nbg1, hel1"
    )
    assert found["size in ash"].fix.startswith("remove ash from locations")
    found = await findings(fake, server_type="cx99")
    assert not found["size"].ok
    assert "serverType 'cx99': Hetzner has no server type of that name" in found["size"].detail
    assert found["image"].ok  # checked for x86, the default, all the same


async def test_sold_out_everywhere_is_a_capacity_finding_and_a_deprecation_is_told(
    fake: HetznerFake,
) -> None:
    fake.set_offer("cx23", "fsn1", available=False)
    fake.set_offer("cx23", "nbg1", available=False, ends="2099-01-01T00:00:00+00:00")
    found = await findings(fake, locations=("fsn1", "nbg1"))
    assert found["size in fsn1"].ok
    assert "not available now: creates move on" in found["size in fsn1"].detail
    assert "unavailable after 2099-01-01" in found["size in nbg1"].detail
    assert not found["capacity"].ok
    assert found["capacity"].fix.startswith("list more locations")
    fake.set_offer("cx23", "hel1", ends="2025-01-01T00:00:00+00:00")  # over: not offered
    found = await findings(fake, locations=("hel1",))
    assert not found["size in hel1"].ok
    assert "capacity" not in found


async def test_an_image_missing_for_the_types_architecture_or_without_apt(
    fake: HetznerFake,
) -> None:
    found = await findings(fake, image="debian-13", server_type="cax11")  # x86 only here
    assert not found["image"].ok
    assert found["image"].detail == "Hetzner has no image 'debian-13' for arm servers"
    found = await findings(fake, image="debian-12", server_type="cax11")
    assert found["image"].ok
    assert "id 114690389" in found["image"].detail
    found = await findings(fake, image="rocky-9")
    assert not found["image"].ok
    assert "installs with apt, on Debian or Ubuntu only" in found["image"].detail
    found = await findings(fake, image="rocky-9", install_squid=False)
    assert found["image"].ok
    found = await findings(fake, image="999")
    assert not found["image"].ok


async def test_a_firewall_of_someone_else_and_one_with_other_rules(fake: HetznerFake) -> None:
    fake.put_firewall(f"egress-proxies-{ENTRY}", {"team": "search"})
    found = await findings(fake)
    assert not found["firewall"].ok
    assert "exists without the labels of provider" in found["firewall"].detail
    assert found["firewall"].fix.startswith("delete or rename that firewall")
    (theirs,) = list(fake.firewalls)
    fake.firewalls[theirs]["labels"] = {
        "egress-proxies/managed": "true",
        "egress-proxies/provider": ENTRY,
    }
    found = await findings(fake)
    assert found["firewall"].ok
    assert "exists with other rules: the next create sets them to inbound TCP 3128" in (
        found["firewall"].detail
    )
    assert fake.firewalls[theirs]["rules"] == []  # read, not written


async def test_a_call_that_fails_is_that_checks_finding_and_the_rest_still_run(
    fake: HetznerFake,
) -> None:
    fake.inject(503, "unavailable", kind="image_list")
    found = await findings(fake)
    assert not found["image"].ok
    assert found["image"].fix == "try again: Hetzner did not answer this call"
    assert found["firewall"].ok
    assert found["size in fsn1"].ok
