"""`egress-proxies up` with a digitalocean provider entry against the local fake of the
DigitalOcean API: every droplet answers at 127.0.0.1, where a real Squid (the product's) stands
in for the VM on the entry's proxyPort, so the health probe goes through a real proxy.

A Proxy goes Ready; its droplet destroyed behind the system's back is replaced by a new one and
the Proxy is Ready again; deleting the Proxy deletes its droplet, and GC then deletes the entry's
cloud firewall. The API token appears nowhere in `up`'s output nor in any event stream.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.providers.digitalocean.testing import DigitalOceanFake
from tests.support.crawl_squid import tagged_squids
from tests.support.system import Up, hello_target, running_up
from tests.support.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOKEN = "dop_v1_e2e_0f9c2d7a8b3e4f5061728394a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e"
STREAMS = ("proxy", "lease", "gc", "pool", "demand", "deadletter")

PROVIDERS = """\
providers:
  - name: do-ams
    type: digitalocean
    auth: none
    digitalocean:
      endpointUrl: {url}
      allowedClients: [127.0.0.0/8]
      proxyPort: {port}
      regions: [ams3, fra1]
"""

PROXY = """\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {name: do-1, namespace: crawl}
spec:
  provider: do-ams
  attributes: {country: nl}
  healthCheck: {intervalSeconds: 1}
"""


async def proxy(up: Up) -> dict[str, Any] | None:
    return next((p for p in await up.proxies() if p["name"] == "do-1"), None)


async def ready(up: Up) -> bool:
    found = await proxy(up)
    return found is not None and found["phase"] == "Ready" and found["healthy"] is True


async def test_a_proxy_on_digitalocean_lives_is_replaced_and_is_cleaned_up(tmp_path: Path) -> None:
    with DigitalOceanFake(token=TOKEN, addresses=["127.0.0.1"]) as fake, hello_target() as target:
        async with tagged_squids(tmp_path / "squids", ["do-standin"]) as (squid,):
            providers = tmp_path / "providers.yaml"
            providers.write_text(PROVIDERS.format(url=fake.url, port=squid.port))
            manifest = tmp_path / "proxy.yaml"
            manifest.write_text(PROXY)
            flags = [
                "--providers-config", str(providers),
                "--observe-interval", "1",
                "--gc-interval", "1s",
                "--gc-grace", "1s",
            ]  # fmt: skip
            async with running_up(
                tmp_path, *flags, health_check_url=target, up_env={"DIGITALOCEAN_TOKEN": TOKEN}
            ) as up:
                applied = await up.cli("apply", "-f", str(manifest), "--wait", "--timeout", "60")
                assert applied.returncode == 0, applied.stdout + applied.stderr
                (first,) = fake.droplets
                found = await proxy(up)
                assert found is not None
                assert found["url"] == f"http://127.0.0.1:{squid.port}"
                assert len(fake.firewalls) == 1

                fake.destroy(first)  # a person in the control panel

                async def replaced() -> bool:
                    return fake.created_total == 2 and await ready(up)

                await until(replaced, timeout=60.0, what="do-1 Ready on a new droplet")
                (second,) = fake.droplets
                assert second != first
                await until(
                    lambda: len(fake.firewalls) == 1,
                    timeout=10.0,
                    what="the replacement's firewall",
                )

                deleted = await up.cli("delete", "crawl/do-1", "--wait", "--timeout", "60")
                assert deleted.returncode == 0, deleted.stdout + deleted.stderr
                await until(
                    lambda: not fake.droplets and not fake.firewalls,
                    timeout=60.0,
                    what="the droplet deleted and the firewall swept by GC",
                )
                streams = {s: await up.cli("events", "--stream", s, "-o", "json") for s in STREAMS}
    for name, got in streams.items():
        assert got.returncode == 0, (name, got.stdout + got.stderr)
        assert TOKEN not in got.stdout + got.stderr, name
    gc = [json.loads(line) for line in streams["gc"].stdout.splitlines() if line.strip()]
    swept = [e for e in gc if e["type"] == "OrphanDeleted" and e["event"].get("kind") == "firewall"]
    # Once at the end; once more if a sweep fell in the gap between the destroyed droplet and its
    # replacement (no droplet then: the next create made the firewall again first).
    assert 1 <= len(swept) <= 2, gc
    assert TOKEN not in up.output.decode(errors="replace")
    assert "firewall made" in up.output.decode(errors="replace")  # the provider's logs are here
    assert fake.created_total == 2
