"""`egress-proxies up` with a digitalocean provider entry against the local fake of the
DigitalOcean API: every droplet answers at 127.0.0.1, where a real Squid (the product's) stands
in for the VM on the entry's proxyPort, so the health probe goes through a real proxy.

A Proxy goes Ready; its droplet destroyed behind the system's back is replaced by a new one and
the Proxy is Ready again; deleting the Proxy deletes its droplet, and GC then deletes the entry's
cloud firewall. The API token appears nowhere in `up`'s output nor in any event stream.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.testing.digitalocean import DigitalOceanFake
from tests.support.cloud_up import Cloud, cloud_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "dop_v1_e2e_0f9c2d7a8b3e4f5061728394a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e"
CLOUD = Cloud(
    "digitalocean",
    "do-ams",
    {"regions": ["ams3", "fra1"]},
    {"DIGITALOCEAN_TOKEN": TOKEN},
    (TOKEN,),
)


async def test_a_proxy_on_digitalocean_lives_is_replaced_and_is_cleaned_up(tmp_path: Path) -> None:
    with DigitalOceanFake(token=TOKEN, addresses=["127.0.0.1"]) as fake:
        async with cloud_up(
            tmp_path, CLOUD, fake.url, proxy="do-1", attributes={"country": "nl"}
        ) as run:
            await run.apply_and_wait()
            (first,) = fake.droplets
            assert len(fake.firewalls) == 1

            fake.destroy(first)  # a person in the control panel

            async def replaced() -> bool:
                return fake.created_total == 2 and await run.ready()

            await until(replaced, timeout=60.0, what="do-1 Ready on a new droplet")
            (second,) = fake.droplets
            assert second != first
            await until(
                lambda: len(fake.firewalls) == 1, timeout=10.0, what="the replacement's firewall"
            )

            await run.delete()
            await until(
                lambda: not fake.droplets and not fake.firewalls,
                timeout=60.0,
                what="the droplet deleted and the firewall swept by GC",
            )
    run.assert_credentials_hidden()
    # Once at the end; once more if a sweep fell in the gap between the destroyed droplet and its
    # replacement (no droplet then: the next create made the firewall again first).
    assert 1 <= len(run.swept_firewalls()) <= 2, run.streams["gc"].stdout
    assert "firewall made" in run.output  # the provider's logs are here
    assert fake.created_total == 2
