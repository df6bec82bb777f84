"""`egress-proxies up` with one cloud provider entry pointing at that cloud's local fake, a real
Squid (the product's) standing in for the VM on the entry's ``proxyPort``, and one Proxy on it.

The fakes answer every instance at 127.0.0.1, so the health probe reaches a real Squid through
the address the provider reports. The aws, digitalocean and hetzner end-to-end tests share this
run and its checks; each keeps what differs between the clouds: its fake, its config block, how it
acts behind the system's back and how it sees the firewall (docs/providers.md).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.crawl_squid import TaggedSquid, tagged_squids
from tests.support.system import Up, hello_target, running_up

STREAMS = ("proxy", "lease", "gc", "pool", "demand", "deadletter")
ALLOWED = "127.0.0.0/8"
"""The entry's allowedClients: where the health probe and the stand-in Squid are."""


@dataclass(frozen=True)
class Cloud:
    """One provider entry of a cloud type, as `up` is given it."""

    type: str
    entry: str
    settings: Mapping[str, object]
    """The entry's fields beyond endpointUrl, allowedClients and proxyPort, which the run sets."""
    credentials: Mapping[str, str]
    """The environment `up` alone gets (the CLI commands never see it)."""
    secrets: tuple[str, ...]
    """The parts of ``credentials`` that must appear nowhere: output, errors, events."""


def providers_config(cloud: Cloud, endpoint: str, port: int) -> str:
    """The providers config (YAML; each value written as JSON, which YAML reads as is)."""
    fields = {"endpointUrl": endpoint, "allowedClients": [ALLOWED], "proxyPort": port}
    lines = [f"      {k}: {json.dumps(v)}" for k, v in {**fields, **cloud.settings}.items()]
    head = f"providers:\n  - name: {cloud.entry}\n    type: {cloud.type}\n    auth: none\n"
    return head + f"    {cloud.type}:\n" + "\n".join(lines) + "\n"


def proxy_manifest(name: str, entry: str, attributes: Mapping[str, str]) -> str:
    return f"""\
apiVersion: crawl.example.com/v1alpha1
kind: Proxy
metadata: {{name: {name}, namespace: crawl}}
spec:
  provider: {entry}
  attributes: {json.dumps(dict(attributes))}
  healthCheck: {{intervalSeconds: 1}}
"""


@dataclass
class CloudUp:
    """A running `up` with one Proxy manifest written, and after the run every event stream as
    the CLI printed it and `up`'s whole output."""

    cloud: Cloud
    up: Up
    squid: TaggedSquid
    name: str
    manifest: Path
    streams: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The proxy URL the provider must report: the stand-in's port at the fake's address."""
        return f"http://127.0.0.1:{self.squid.port}"

    @property
    def output(self) -> str:
        return self.up.output.decode(errors="replace")

    async def apply(self, *extra: str) -> None:
        applied = await self.up.cli("apply", "-f", str(self.manifest), *extra)
        assert applied.returncode == 0, applied.stdout + applied.stderr

    async def apply_and_wait(self) -> None:
        """Apply, wait for Ready as the CLI does, and check the proxy is at the stand-in."""
        await self.apply("--wait", "--timeout", "60")
        found = await self.proxy()
        assert found is not None
        assert found["url"] == self.url

    async def proxy(self) -> dict[str, Any] | None:
        return next((p for p in await self.up.proxies() if p["name"] == self.name), None)

    async def ready(self) -> bool:
        found = await self.proxy()
        return found is not None and found["phase"] == "Ready" and found["healthy"] is True

    async def delete(self) -> None:
        deleted = await self.up.cli("delete", f"crawl/{self.name}", "--wait", "--timeout", "60")
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr

    async def events(self, stream: str) -> list[dict[str, Any]]:
        """One stream as it is now, while `up` runs."""
        got = await self.up.cli("events", "--stream", stream, "-o", "json")
        assert got.returncode == 0, got.stdout + got.stderr
        return parsed(got.stdout)

    def swept_firewalls(self) -> list[dict[str, Any]]:
        """GC's OrphanDeleted events for the entry's firewall, from the streams read at the end."""
        return [
            e
            for e in parsed(self.streams["gc"].stdout)
            if e["type"] == "OrphanDeleted" and e["event"].get("kind") == "firewall"
        ]

    def assert_credentials_hidden(self) -> None:
        """No secret part of the credentials in any stream, any CLI error or `up`'s output; and
        the streams were read (the proxy stream names the entry), so absence means something."""
        assert self.streams, "the streams are read when the run ends"
        for name, got in self.streams.items():
            assert got.returncode == 0, (name, got.stdout + got.stderr)
            for secret in self.cloud.secrets:
                assert secret not in got.stdout + got.stderr, name
        for secret in self.cloud.secrets:
            assert secret not in self.output
        assert self.cloud.entry in self.streams["proxy"].stdout


def parsed(lines: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines.splitlines() if line.strip()]


@asynccontextmanager
async def cloud_up(
    tmp_path: Path,
    cloud: Cloud,
    endpoint: str,
    *,
    proxy: str,
    attributes: Mapping[str, str],
    gc_interval: str = "1s",
) -> AsyncIterator[CloudUp]:
    """`up` observing every second and running GC every ``gc_interval`` with a grace of 1s, so a
    firewall left without instances is swept within the test. The streams are read when the
    body is done, before `up` stops; ``output`` is whole once this has exited."""
    async with tagged_squids(tmp_path / "squids", [f"{cloud.type}-standin"]) as (squid,):
        providers = tmp_path / "providers.yaml"
        providers.write_text(providers_config(cloud, endpoint, squid.port))
        manifest = tmp_path / "proxy.yaml"
        manifest.write_text(proxy_manifest(proxy, cloud.entry, attributes))
        flags = [
            "--providers-config", str(providers),
            "--observe-interval", "1",
            "--gc-interval", gc_interval,
            "--gc-grace", "1s",
        ]  # fmt: skip
        with hello_target() as target:
            async with running_up(
                tmp_path, *flags, health_check_url=target, up_env=dict(cloud.credentials)
            ) as up:
                run = CloudUp(cloud, up, squid, proxy, manifest)
                yield run
                run.streams = {
                    s: await up.cli("events", "--stream", s, "-o", "json") for s in STREAMS
                }
