"""`egress-proxies up` with a hetzner provider entry against the local fake of the Hetzner Cloud
API: every server answers at 127.0.0.1, where a real Squid (the product's) stands in for the VM
on the entry's proxyPort, so the health probe goes through a real proxy.

A Proxy goes Ready on a server with the entry's firewall attached; the server deleted behind the
system's back is replaced and the Proxy is Ready again, and so is a server powered off; deleting
the Proxy deletes its server, and GC then deletes the entry's firewall. The API token appears
nowhere in `up`'s output nor in any event stream.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.testing.hetzner import HetznerFake
from tests.support.cloud_up import ALLOWED, Cloud, CloudUp, cloud_up
from tests.support.hetzner_support import TOKEN
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FIREWALL = "egress-proxies-hz-fsn"
CLOUD = Cloud(
    "hetzner", "hz-fsn", {"locations": ["fsn1", "nbg1"]}, {"HCLOUD_TOKEN": TOKEN}, (TOKEN,)
)


async def ready_on_a_new_server(
    run: CloudUp, fake: HetznerFake, created: int, *, without: int = 0
) -> bool:
    """Ready and healthy on the ``created``-th server, the server ``without`` gone."""
    return fake.created_total == created and without not in fake.servers and await run.ready()


async def test_a_proxy_on_hetzner_lives_is_replaced_and_is_cleaned_up(tmp_path: Path) -> None:
    with HetznerFake(TOKEN, addresses=["127.0.0.1"]) as fake:
        async with cloud_up(
            tmp_path, CLOUD, fake.url, proxy="hz-1", attributes={"country": "de"}
        ) as run:
            await run.apply_and_wait()
            (first,) = fake.servers
            made = fake.firewall_named(FIREWALL)
            assert made is not None
            assert made["rules"][0]["source_ips"] == [ALLOWED]
            assert made["rules"][0]["port"] == str(run.squid.port)
            assert fake.servers[first].body["public_net"]["firewalls"] == [
                {"id": made["id"], "status": "applied"}
            ]

            fake.vanish(first)  # a person in the Cloud Console
            await until(
                lambda: ready_on_a_new_server(run, fake, 2),
                timeout=60.0,
                what="hz-1 Ready on a new server after its server vanished",
            )
            (second,) = fake.servers
            fake.power_off(second)  # Hetzner bills an off server: it is replaced
            await until(
                lambda: ready_on_a_new_server(run, fake, 3, without=second),
                timeout=60.0,
                what="hz-1 Ready on a new server, the powered-off one deleted",
            )

            await run.delete()
            await until(
                lambda: not fake.servers and not fake.firewalls,
                timeout=60.0,
                what="the server deleted and the firewall swept by GC",
            )
    run.assert_credentials_hidden()
    assert "server create accepted" in run.output  # the provider's own log lines are in there
    swept = run.swept_firewalls()
    assert swept, run.streams["gc"].stdout
    assert all(e["event"]["ok"] for e in swept), swept
    # GC may also have taken the firewall while a replaced server was gone and its successor
    # not yet made (grace 1s); the next create made it again. Every one made was swept.
    assert fake.calls("firewall_create") == len(swept)
    assert fake.created_total == 3
