"""The gateway service: ``egress-proxies run gateway``, and in ``up`` on ``--gateway-port``
(docs/gateway.md).

It listens for crawlers, leases through the discovery API with each crawler's own token, and
relays. It reads no stream and decides nothing about instances: any number of replicas run side
by side behind a load balancer, and a session finds its lease from any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import msgspec
import structlog

from services.gateway.api import Api
from services.gateway.bounds import Limits
from services.gateway.leases import Keeper
from services.gateway.metrics import gateway_metrics
from services.gateway.pure.outcomes import parse_block_codes
from services.gateway.server import Gateway
from services.gateway.traffic import TrafficRecorder, traffic_metrics
from services.runtime.bearer import token_from_env
from services.runtime.clients import Clients
from services.runtime.ports import listening_socket
from services.runtime.service import ServiceContext
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.gateway")


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run gateway`` takes (docs/decisions/0148-one-settings-struct-per-service.md)."""

    gateway_port: Annotated[
        int, setting("Port crawlers use as their proxy.", env="GATEWAY_PORT", ge=1, le=65535)
    ] = 8000
    gateway_host: Annotated[
        str,
        setting(
            "Address the gateway listens on; 0.0.0.0 in a container. Without clients (no "
            "--clients-file, no DISCOVERY_TOKEN) only a loopback address is allowed, unless "
            "--insecure-open.",
            env="GATEWAY_HOST",
        ),
    ] = "127.0.0.1"
    api_url: Annotated[
        str | None,
        setting(
            "The discovery API the gateway leases through, e.g. http://egress-discovery:8080; "
            "default http://127.0.0.1:<--api-port>.",
            env="GATEWAY_API_URL",
            metavar="URL",
            show_default=False,
        ),
    ] = None
    api_port: Annotated[
        int,
        setting(
            "Port of the discovery API on this host, when --api-url is not given.",
            env="DISCOVERY_PORT",
            ge=1,
            le=65535,
        ),
    ] = 8080
    clients_file: Annotated[
        str | None,
        setting(
            'The API\'s clients (docs/api.md, "Clients"): a crawler logs in to the gateway '
            "with its name as the user and its token as the password.",
            env="DISCOVERY_CLIENTS_FILE",
            metavar="FILE",
            show_default=False,
        ),
    ] = None
    insecure_open: Annotated[
        bool,
        setting(
            "Serve anyone, without a login, on any address: an open proxy to the whole fleet. "
            "Only behind a network that admits nobody else.",
            env="GATEWAY_INSECURE_OPEN",
        ),
    ] = False
    block_codes: Annotated[
        str,
        setting(
            "Response statuses reported `blocked` for the target (and retried once through "
            "another proxy when the method is idempotent), comma-separated.",
            env="GATEWAY_BLOCK_CODES",
            metavar="CODES",
        ),
    ] = "403,429"
    session_ttl: Annotated[
        float,
        setting(
            "How long a session lives unused (its lease's TTL, renewed while it is used), when "
            "the user name gives no ttl.",
            ge=1,
            le=86_400,
            duration=True,
            metavar="DURATION",
            env="GATEWAY_SESSION_TTL",
        ),
    ] = 300.0
    rotating_leases: Annotated[
        int,
        setting(
            "Leases a replica holds per client and selector for requests without a session, "
            "taken in turn (a proxy per request); the client's maxLeases still bounds them.",
            ge=1,
            le=1000,
            env="GATEWAY_ROTATING_LEASES",
        ),
    ] = 4
    rotating_idle: Annotated[
        float,
        setting(
            "A rotating lease unused this long is released.",
            ge=1,
            le=3600,
            duration=True,
            metavar="DURATION",
            env="GATEWAY_ROTATING_IDLE",
        ),
    ] = 30.0
    traffic_interval: Annotated[
        float,
        setting(
            "How often the traffic counted per client, proxy, lease and host is appended to the "
            "TRAFFIC stream (docs/decisions/0158-traffic-records.md).",
            ge=1,
            le=3600,
            duration=True,
            metavar="DURATION",
            env="GATEWAY_TRAFFIC_INTERVAL",
        ),
    ] = 10.0
    max_connections_per_address: Annotated[
        int,
        setting(
            "Crawler connections one address may hold open at once; more are answered 429.",
            ge=1,
            le=1_000_000,
            env="GATEWAY_MAX_CONNECTIONS_PER_ADDRESS",
        ),
    ] = 1024


@dataclass
class GatewayService:
    settings: GatewaySettings
    clients: Clients
    name: str = "gateway"
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    bound_port: int = 0
    own_ports: tuple[int, ...] = ()
    limits: Limits | None = None
    """The gateway's bounds (docs/decisions/0156-the-gateway-s-edges.md); from the settings
    when not given."""
    gateway: Gateway | None = None
    """The running gateway, once it listens (its counts, for tests and the bench)."""

    @property
    def api_url(self) -> str:
        return self.settings.api_url or f"http://127.0.0.1:{self.settings.api_port}"

    async def run(self, ctx: ServiceContext) -> None:
        config = self.settings
        api = Api(self.api_url)
        keeper = Keeper(
            api,
            rotating=config.rotating_leases,
            idle=config.rotating_idle,
            session_ttl=config.session_ttl,
        )
        nats_ports = [urlsplit(u).port or 4222 for u in ctx.settings.nats_urls]
        metrics_port = [ctx.settings.metrics_port] if ctx.settings.metrics_port else []
        sock = listening_socket(config.gateway_host, config.gateway_port, "--gateway-port")
        self.bound_port = sock.getsockname()[1]
        metrics = gateway_metrics(ctx.metrics.registry)
        recorder = TrafficRecorder(
            ctx.store, traffic_metrics(ctx.metrics.registry), interval=config.traffic_interval
        )
        self.clients.file_error = metrics.file_errors.inc
        gateway = Gateway(
            keeper,
            self.clients,
            metrics,
            limits=self.limits or Limits(per_address=config.max_connections_per_address),
            block_codes=parse_block_codes(config.block_codes),
            traffic=recorder,
            own_ports=(
                self.bound_port,
                urlsplit(self.api_url).port or 80,
                *nats_ports,
                *metrics_port,
                *self.own_ports,
            ),
        )
        self.gateway = gateway
        server = await asyncio.get_running_loop().create_server(gateway.protocol, sock=sock)
        # What start-up made lives as long as the process: kept out of the collector's full
        # passes, which the requests' short-lived objects set off (docs/architecture.md, "The
        # gateway").
        gc.freeze()
        self.listening.set()
        log.info(
            "gateway listening",
            address=f"{config.gateway_host}:{self.bound_port}",
            api=self.api_url,
            clients="open" if self.clients.open else "clients file",
        )

        def show(sessions: int, rotating: int) -> None:
            metrics.leases.labels("session").set(sessions)
            metrics.leases.labels("rotating").set(rotating)

        tasks = [
            asyncio.create_task(keeper.run(show=show)),
            asyncio.create_task(self.clients.run()),
            asyncio.create_task(recorder.run()),
        ]
        try:
            await server.serve_forever()
        finally:
            self.listening.clear()
            server.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(Exception):
                await keeper.close()
            gateway.close()
            await api.aclose()


def check_open(config: GatewaySettings, clients: Clients) -> None:
    """A gateway without clients is an open proxy to the fleet: only on loopback, or when told."""
    if not clients.open or config.insecure_open:
        return
    try:
        loopback = ipaddress.ip_address(config.gateway_host).is_loopback
    except ValueError:
        loopback = config.gateway_host == "localhost"
    if not loopback:
        raise ConfigError(
            f"--gateway-host {config.gateway_host}: a gateway without clients (no "
            "--clients-file, no DISCOVERY_TOKEN) would be an open proxy to the whole fleet; give "
            "it the clients file, listen on 127.0.0.1, or pass --insecure-open if nobody else "
            "can reach this address"
        )


def build(settings: Settings, config: GatewaySettings) -> GatewayService:
    """The factory ``run gateway`` and ``up`` call."""
    del settings
    try:
        parse_block_codes(config.block_codes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    token = token_from_env()
    clients = Clients(Path(config.clients_file) if config.clients_file else None, token, log=log)
    check_open(config, clients)
    return GatewayService(config, clients)
