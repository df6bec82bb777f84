"""The gateway under test: the real service on a free loopback port, leasing through a discovery
replica of ``tests.support.discovery``, with tagged Squids (``crawl_squid``) as its proxies, so a
site can tell which proxy a request came through (``fleet``: all of them and a site)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.gateway.bounds import Limits
from services.gateway.service import GatewayService, GatewaySettings, build
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.nats.connection import connect
from services.runtime.nats.server import EmbeddedNatsServer
from services.runtime.observability.metrics import Metrics
from services.runtime.ports import free_port
from services.runtime.pure.clients import hash_token
from services.runtime.service import ServiceContext
from services.runtime.settings.shared import Settings
from tests.support.cli_process import ROOT, clean_env
from tests.support.crawl_site import Site, crawl_site
from tests.support.crawl_squid import tagged_squids
from tests.support.discovery import discovery, ready_proxy
from tests.support.waiting import listening, until

TOKENS = {"crawler-a": "a" * 40, "crawler-b": "b" * 40, "reader": "r" * 40}


def gateway_clients(path: Path, *, max_leases: int | None = None) -> Path:
    """Two crawlers that may lease, and one that may only read."""
    limit = f", maxLeases: {max_leases}" if max_leases is not None else ""
    lines = ["clients:"]
    for name in ("crawler-a", "crawler-b"):
        token = hash_token(TOKENS[name])
        lines.append(f"  - {{name: {name}, token: '{token}', scopes: [lease, read]{limit}}}")
    lines.append(f"  - {{name: reader, token: '{hash_token(TOKENS['reader'])}', scopes: [read]}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def proxy_url(port: int, user: str = "crawler-a", *, client: str = "crawler-a") -> str:
    """The proxy URL a crawler gives its HTTP client: ``user`` (the client's name and
    parameters) and the client's token."""
    return f"http://{user}:{TOKENS[client]}@127.0.0.1:{port}"


def basic(user: str, token: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()


@contextlib.asynccontextmanager
async def gateway(
    nats_url: str,
    api_url: str,
    clients_file: Path | None,
    *,
    limits: Limits | None = None,
    own_ports: tuple[int, ...] = (),
    **settings: object,
) -> AsyncIterator[GatewayService]:
    """A gateway replica; ``settings`` are ``GatewaySettings`` fields, ``limits`` its bounds
    (from the settings when not given), ``own_ports`` more ports it must never go to."""
    config = GatewaySettings(
        gateway_port=free_port(),
        api_url=api_url,
        clients_file=str(clients_file) if clients_file else None,
        **settings,  # type: ignore[arg-type]
    )
    service = build(Settings(nats_url=nats_url), config)
    service.limits, service.own_ports = limits, own_ports
    conn = await connect(nats_url)
    ctx = ServiceContext(
        settings=Settings(nats_url=nats_url),
        conn=conn,
        store=JetStreamEventStore(conn.nc, conn.js),
        metrics=Metrics(),
    )
    task = asyncio.create_task(service.run(ctx))
    try:
        async with asyncio.timeout(20):
            waiter = asyncio.create_task(service.listening.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task.done():
                await task
        yield service
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await conn.close()


@contextlib.asynccontextmanager
async def gateway_process(
    nats_url: str, api_url: str, clients_file: Path, *extra: str
) -> AsyncIterator[tuple[int, int]]:
    """``egress-proxies run gateway`` as a process of its own (its CPU its own, kill -9 real);
    yields its pid and port once it listens, and kills it after."""
    port = free_port()
    command = [sys.executable, "-m", "services.cli.main", "run", "gateway"]
    command += ["--gateway-port", str(port), "--api-url", api_url]
    command += ["--clients-file", str(clients_file), "--nats-url", nats_url, "--metrics-port", "0"]
    process = await asyncio.create_subprocess_exec(
        *command,
        *extra,
        cwd=ROOT,
        env=clean_env(PYTHONPATH=str(ROOT)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until(lambda: listening(port), timeout=60, what="the gateway process listening")
        yield process.pid, port
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


UIDS = ["g1", "g2", "g3"]
"""The fleet's proxies (tagged Squids), all with ``country: de``."""


@dataclass
class Fleet:
    site: Site
    api: str
    gateway_port: int
    nats_url: str
    clients_file: Path
    service: GatewayService | None = None

    def client(self, user: str = "crawler-a", *, client: str = "crawler-a") -> httpx.AsyncClient:
        return httpx.AsyncClient(
            proxy=proxy_url(self.gateway_port, user, client=client), timeout=20, trust_env=False
        )

    def page(self, n: int = 1) -> str:
        return f"http://127.0.0.1:{self.site.port}/page/{n}"

    def api_client(self, client: str = "crawler-a") -> httpx.AsyncClient:
        """The discovery API as ``client``: what the gateway leased on its behalf."""
        headers = {"Authorization": f"Bearer {TOKENS[client]}"}
        return httpx.AsyncClient(base_url=self.api, headers=headers, trust_env=False)


@contextlib.asynccontextmanager
async def fleet(
    nats_server: EmbeddedNatsServer,
    store: JetStreamEventStore,
    tmp_path: Path,
    *,
    block: bool = False,
    max_leases: int | None = None,
    limits: Limits | None = None,
    own_ports: tuple[int, ...] = (),
    **settings: object,
) -> AsyncIterator[Fleet]:
    """Three tagged Squids ready in a discovery replica, a site, and a gateway before them;
    the other arguments go to ``gateway``."""
    clients_file = gateway_clients(tmp_path / "clients.yaml", max_leases=max_leases)
    with crawl_site(64, block=block) as site:
        async with (
            tagged_squids(tmp_path / "squids", UIDS) as squids,
            discovery(nats_server.url, clients_file=clients_file) as (_, api),
        ):
            for squid in squids:
                await ready_proxy(store, squid.uid, {"country": "de"}, port=squid.port)
            async with gateway(
                nats_server.url, api, clients_file, limits=limits, own_ports=own_ports, **settings
            ) as service:
                yield Fleet(site, api, service.bound_port, nats_server.url, clients_file, service)
