"""The digitalocean provider against a fake that answers as DigitalOcean does where the earlier
fake did not (D142): sizes offered in some regions only, checked against the cached
``/v2/sizes`` before a create; firewall rules refused without ``ports``; paths percent-decoded
(the tag lookup); and the listing by a tag nobody made yet."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from services.providers.base import Permanent
from services.providers.digitalocean import catalogue
from services.providers.digitalocean.provider import DigitalOceanProvider
from services.testing.digitalocean import (
    DEFAULT_TOKEN,
    LIMITED_REGIONS,
    LIMITED_SIZE,
    SIZES,
    DigitalOceanFake,
)
from tests.contract.provider import closing
from tests.support.digitalocean_support import ENTRY, do, fake, provider, request

pytestmark = pytest.mark.integration
__all__ = ["do", "fake"]  # fixtures

PROVIDER_TAG = f"egress-proxies-provider:{ENTRY}"
NOT_IN_REGION = "Size is not available in this region."


def call(fake: DigitalOceanFake, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """One raw request, encoded as any HTTP client may (percent-encoded path included)."""
    sent = urllib.request.Request(
        fake.url + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {DEFAULT_TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(sent, timeout=10) as answer:
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


# ----------------------------------------------------------------------------- the fake


def test_the_fake_lists_each_size_with_its_regions_and_refuses_it_elsewhere(
    fake: DigitalOceanFake,
) -> None:
    status, answer = call(fake, "GET", "/v2/sizes?per_page=200")
    assert status == 200
    listed = {s["slug"]: s for s in answer["sizes"]}
    assert set(listed) == SIZES
    assert listed[LIMITED_SIZE]["regions"] == list(LIMITED_REGIONS)
    assert all(isinstance(s["available"], bool) for s in listed.values())
    droplet = {"name": "px-raw", "size": LIMITED_SIZE, "image": "debian-12-x64"}
    status, answer = call(fake, "POST", "/v2/droplets", {**droplet, "region": "lon1"})
    assert (status, answer["message"]) == (422, NOT_IN_REGION)
    assert call(fake, "POST", "/v2/droplets", {**droplet, "region": "ams3"})[0] == 202


def test_the_fake_refuses_a_rule_without_ports_icmp_included(fake: DigitalOceanFake) -> None:
    everywhere = {"addresses": ["0.0.0.0/0"]}
    rule: dict[str, Any] = {"protocol": "icmp", "destinations": everywhere}
    firewall = {"name": "fw", "outbound_rules": [rule]}
    status, answer = call(fake, "POST", "/v2/firewalls", firewall)
    assert (status, answer["id"]) == (422, "unprocessable_entity")
    assert "ports is required" in answer["message"]
    rule["ports"] = "0"
    assert call(fake, "POST", "/v2/firewalls", firewall)[0] == 202


def test_the_fake_decodes_paths_as_a_server_does(fake: DigitalOceanFake) -> None:
    assert call(fake, "POST", "/v2/tags", {"name": PROVIDER_TAG})[0] == 201
    status, answer = call(fake, "GET", "/v2/tags/egress-proxies-provider%3Ado-ams")
    assert (status, answer["tag"]["name"]) == (200, PROVIDER_TAG)


# ----------------------------------------------------------------------------- sizes


async def test_a_size_outside_the_region_is_permanent_naming_where_it_is_offered(
    fake: DigitalOceanFake,
) -> None:
    async with closing(provider(fake, size=LIMITED_SIZE, regions=("lon1",))) as made:
        with pytest.raises(Permanent) as caught:
            await made.create(request("px-a"))
    said = str(caught.value)
    assert f"size '{LIMITED_SIZE}' is not offered in region lon1" in said
    assert f"DigitalOcean offers it in {', '.join(sorted(LIMITED_REGIONS))}" in said
    assert "such as s-1vcpu-1gb" in said
    assert "(the region lon1 comes from regions)" in said
    # Refused before anything was written: no firewall for a droplet that cannot be.
    assert (fake.calls_of("droplets.create"), fake.firewalls, fake.tags) == (0, {}, set())


async def test_a_placement_size_outside_its_region_names_the_proxy_fields(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    with pytest.raises(Permanent) as caught:
        await do.create(request("px-a", machine_type=LIMITED_SIZE, region="tor1"))
    assert f"spec.placement.machineType '{LIMITED_SIZE}' is not offered in region tor1" in str(
        caught.value
    )
    assert "comes from spec.placement.region" in str(caught.value)
    assert await do.create(request("px-b", machine_type=LIMITED_SIZE, region="fra1"))


async def test_the_catalogue_is_read_once_an_hour_not_per_create(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    now = [1000.0]
    do.catalogue.clock = lambda: now[0]
    for name in ("px-a", "px-b", "px-c"):
        await do.create(request(name))
    assert fake.calls_of("sizes.list") == 1
    now[0] += catalogue.TTL - 1
    await do.create(request("px-d"))
    assert fake.calls_of("sizes.list") == 1
    now[0] += 1
    await do.create(request("px-e"))
    assert fake.calls_of("sizes.list") == 2


async def test_a_create_refused_for_the_region_reads_the_catalogue_again(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    """The copy said yes and the API no: the copy was out of date."""
    await do.create(request("px-a"))
    fake.inject("droplets.create", 422, "unprocessable_entity", NOT_IN_REGION)
    with pytest.raises(Permanent, match="not available in this region"):
        await do.create(request("px-b"))
    await do.create(request("px-c"))
    assert fake.calls_of("sizes.list") == 2


async def test_an_unreadable_catalogue_leaves_the_answer_to_the_create(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    fake.inject("sizes.list", 503, "service_unavailable", "Service Unavailable")
    assert await do.create(request("px-a"))
    assert fake.calls_of("droplets.create") == 1


async def test_every_page_of_the_catalogue_is_read(
    do: DigitalOceanProvider, fake: DigitalOceanFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalogue, "PAGE_SIZE", 2)
    assert set(await do.catalogue.sizes()) == SIZES
    pages = [q["page"] for m, p, q in fake.requests if p == "/v2/sizes"]
    assert pages == ["1", "2", "3"]


# ----------------------------------------------------------------------------- tags


async def test_an_existing_tag_is_used_not_made_again(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    fake.tags.add(PROVIDER_TAG)  # an earlier run's, or made by hand
    await do.create(request("px-a"))
    assert fake.calls_of("tags.get") == 1
    assert fake.calls_of("tags.create") == 0
    assert fake.calls_of("firewalls.create") == 1


async def test_a_new_entry_lists_no_droplet_and_leaves_nothing_over(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    """GC's first sweep of an entry that never made a droplet: its tag does not exist yet, and
    DigitalOcean answers the listing by it 200 with no droplet."""
    fake.put("px-other", ["web"])
    assert await do.list_by_tag() == []
    assert await do.leftovers() == []
    assert PROVIDER_TAG not in fake.tags


async def test_a_404_for_a_tag_nobody_made_is_no_droplet(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    fake.inject("droplets.list", 404, "not_found", "The resource could not be found.")
    assert await do.list_by_tag() == []
    assert fake.calls_of("tags.get") == 1  # the tag's absence was looked up, not assumed


async def test_a_404_while_the_tag_exists_is_an_error_and_the_firewall_stays(
    do: DigitalOceanProvider, fake: DigitalOceanFake
) -> None:
    await do.create(request("px-a"))
    fake.inject("droplets.list", 404, "not_found", "The resource could not be found.")
    with pytest.raises(Permanent, match="although the tag exists"):
        await do.leftovers()
    assert len(fake.firewalls) == 1
