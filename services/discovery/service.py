"""The discovery service: projectors, the lease-expiry sweep and uvicorn, on one event loop.

The views catch up with the log before the socket opens, so the first answer is never from an
empty view. uvicorn runs programmatically on a socket bound here (a busy port is a clear error,
not uvicorn's ``sys.exit``), without its own signal handlers: stopping is the process's job, and
cancelling ``run`` shuts the server down gracefully. What one client can hold of it (time to send
a request, its size, idle connections, connections at once) is bounded (``limits``, D95).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, ClassVar

import msgspec
import structlog
import uvicorn
from litestar import Litestar

from events.schemas import MAX_BLOCK_BACKOFF_SECONDS, MAX_COOLDOWN_SECONDS, MAX_LEASE_SECONDS
from projections.egress import EgressPolicy
from services.discovery.http.access import CLIENTS_ENV
from services.discovery.http.app import MAX_BODY_BYTES, DiscoveryApi, create_app
from services.discovery.http.badrequest import json_bad_request
from services.discovery.http.cork import corked
from services.discovery.http.limits import (
    BODY_TIMEOUT,
    HEAD_TIMEOUT,
    IDLE_PER_ADDRESS,
    KEEP_ALIVE,
    MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
    BodyDeadline,
    IdleConnections,
    Network,
    head_deadline,
)
from services.discovery.leasing.credentials import LeaseCredentials
from services.discovery.leasing.expiry import ExpirySweep
from services.discovery.observability.fleet import FleetSource
from services.discovery.observability.metrics import discovery_metrics
from services.discovery.observability.selectors import MeasuredLeases
from services.discovery.observability.tracing import TracingMiddleware
from services.discovery.pure.policy import LeasePolicy
from services.discovery.views import Views
from services.providers.squidauth.secret import (
    LEASE_SECRET_VARIABLES,
    SECRET_ENV,
    master_secret_from_env,
)
from services.runtime.aio import raise_if_cancelled
from services.runtime.bearer import TOKEN_ENV, token_from_env
from services.runtime.clients import Clients
from services.runtime.eventlog.checkpoint_writer import write_checkpoints
from services.runtime.eventlog.jetstream import JetStreamEventStore
from services.runtime.ports import listening_socket
from services.runtime.service import ServiceContext
from services.runtime.settings.durations import format_duration, seconds_of
from services.runtime.settings.egress import PolicySettings
from services.runtime.settings.errors import ConfigError
from services.runtime.settings.shared import Settings
from services.runtime.settings.spec import setting

log = structlog.get_logger("egress.discovery")


class DiscoverySettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``run discovery`` takes (docs/decisions/0148-one-settings-struct-per-service.md).
    The token and the lease secret come from the environment only (a flag would show in
    ``ps``); durations are written ``30s``, ``5m``, ``1h`` or in seconds."""

    reads_env: ClassVar[tuple[str, ...]] = LEASE_SECRET_VARIABLES
    policy: PolicySettings = msgspec.field(default_factory=PolicySettings)
    port: Annotated[
        int,
        setting(
            "Port of the discovery API (`up` calls it --api-port).",
            env="DISCOVERY_PORT",
            ge=1,
            le=65535,
        ),
    ] = 8080
    host: Annotated[
        str,
        setting(
            "Address the discovery API listens on; 0.0.0.0 in a container.", env="DISCOVERY_HOST"
        ),
    ] = "127.0.0.1"
    clients_file: Annotated[
        str | None,
        setting(
            "The API's clients: names, token hashes, scopes and limits (docs/api.md, "
            '"Clients"); re-read while running, so a removed client is refused within a '
            "second. DISCOVERY_TOKEN, if set too, is one more client (default, admin).",
            env=CLIENTS_ENV,
            metavar="FILE",
            show_default=False,
        ),
    ] = None
    trusted_proxies: Annotated[
        str,
        setting(
            "Addresses or networks of the reverse proxies in front of the API, comma-separated "
            "(10.0.0.0/8,192.0.2.7): only their X-Forwarded-For and X-Forwarded-Proto are "
            "believed, for the console's login limits and links. Empty (the default): nobody's.",
            metavar="CIDRS",
            show_default=False,
        ),
    ] = ""
    max_lease_ttl: Annotated[
        float,
        setting(
            "Longest lease granted, e.g. 30s, 5m, 1h, at most 168h (7 days); a longer request "
            "is granted this long (the answer says ttlClamped).",
            gt=0,
            le=MAX_LEASE_SECONDS,
            duration=True,
            metavar="DURATION",
        ),
    ] = 3600.0
    lease_cooldown: Annotated[
        float,
        setting(
            "How long a proxy rests after a lease ends before another client leases it (the "
            "lease's own client may take it back at once), at most 24h.",
            ge=0,
            le=MAX_COOLDOWN_SECONDS,
            duration=True,
            metavar="DURATION",
        ),
    ] = 10.0
    block_backoff: Annotated[
        float,
        setting(
            "How long a `blocked` report keeps a proxy from that report's target; each further "
            "one for the pair doubles it, up to 24h, and a `success` report ends it. 0: no "
            "back-off.",
            ge=0,
            le=MAX_BLOCK_BACKOFF_SECONDS,
            duration=True,
            metavar="DURATION",
        ),
    ] = 600.0


DEFAULTS = DiscoverySettings()
DEFAULT_HOST = DEFAULTS.host
DEFAULT_PORT = DEFAULTS.port
DEFAULT_MAX_LEASE_TTL = DEFAULTS.max_lease_ttl
DEFAULT_LEASE_COOLDOWN = DEFAULTS.lease_cooldown
DEFAULT_BLOCK_BACKOFF = DEFAULTS.block_backoff
APPEND_TIMEOUT = 1.5
"""How long a lease write waits for the log before the API answers 503 (docs/api.md)."""


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (they would fight the CLI's)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """The API's listening socket (``services.runtime.ports.listening_socket``)."""
    return listening_socket(host, port, "--port / --host (`up --api-port`, `run discovery --port`)")


@dataclass
class DiscoveryService:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_lease_ttl: float = DEFAULT_MAX_LEASE_TTL
    lease_cooldown: float = DEFAULT_LEASE_COOLDOWN
    block_backoff: float = DEFAULT_BLOCK_BACKOFF
    token: str | None = None
    expiry_interval: float = 1.0
    shutdown_timeout: float = 3.0
    name: str = "discovery"
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    bound_port: int = 0
    api: DiscoveryApi | None = None
    app: Litestar | None = None
    """The app being served, once it is: its route table is what the tests call."""
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    append_timeout: float = APPEND_TIMEOUT
    snapshot_interval: float = 30.0
    """How often the views are written as snapshots for the next replica to start from."""
    lease_secret: bytes | None = field(default=None, repr=False)
    """The master lease secret: lease URLs carry credentials minted with it (D84)."""
    clients: Clients | None = None
    """Who may call the API (the clients file and the token); None: built from ``token``."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """How a proxy's egress findings decide whether it is leased (D111)."""
    trusted_proxies: tuple[Network, ...] = ()
    """Whose ``X-Forwarded-For``/``-Proto`` is believed (``--trusted-proxies``); none: nobody's,
    so no caller can claim another address (D135)."""
    idle_per_address: int = IDLE_PER_ADDRESS
    budget_clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC), repr=False)
    """Which UTC day it is for upstream budgets alone (D162); a test moves it to the next day."""

    def check(self) -> None:
        """The bounds ``build`` applies to the flags, for a service made without it: values
        out of them would be written into every lease event (docs/api.md, "Running it")."""
        seconds_of("--max-lease-ttl", self.max_lease_ttl, positive=True, maximum=MAX_LEASE_SECONDS)
        seconds_of("--lease-cooldown", self.lease_cooldown, maximum=MAX_COOLDOWN_SECONDS)
        seconds_of("--block-backoff", self.block_backoff, maximum=MAX_BLOCK_BACKOFF_SECONDS)

    async def run(self, ctx: ServiceContext) -> None:
        self.check()
        if not self.lease_secret:
            log.warning(
                f"neither {SECRET_ENV} nor {SECRET_ENV}_FILE is set: lease URLs carry no proxy "
                "credentials, and proxies "
                "that enforce leases will refuse their holders (407); give discovery the same "
                "lease secret as the executor"
            )
        clients = self.clients = self.clients or Clients(token=self.token)
        if clients.open:
            log.warning(
                f"neither --clients-file nor {TOKEN_ENV} is set: the discovery API serves every "
                "caller without authentication, and any caller may use any lease"
            )
        # Its own store on the shared connection: one attempt with a short timeout, so a client
        # hears 503 within about a second of an outage instead of after three long retries.
        store = JetStreamEventStore(
            ctx.conn.nc, ctx.conn.js, timeout=self.append_timeout, attempts=1
        )
        views = Views(
            ctx.conn.js, store, nc=ctx.conn.nc, egress=self.egress, clock=self.budget_clock
        )
        metrics = discovery_metrics(ctx.metrics.registry)
        policy = LeasePolicy(
            max_ttl=self.max_lease_ttl,
            cooldown=self.lease_cooldown,
            block_backoff=self.block_backoff,
            append_timeout=self.append_timeout,
        )
        leases = MeasuredLeases(store, views, policy, metrics, ctx.metrics.registry)
        fleet = FleetSource.watch(ctx.metrics.registry, views, ctx.conn.js)

        def problem() -> str | None:
            if not ctx.conn.nc.is_connected:
                return "not connected to NATS"
            return None if views.caught_up else "views are catching up"

        # Bound first, so a busy port fails at once; served only once the views have caught up.
        sock = listen(self.host, self.port)
        try:
            await views.catch_up()
            # A stop that arrived while catching up may have been swallowed by nats-py (its
            # requests wait with ``asyncio.wait_for``); serving on would outlive the stop.
            raise_if_cancelled()
            credentials = LeaseCredentials(self.lease_secret) if self.lease_secret else None
            self.api = DiscoveryApi(leases, views, ctx.metrics, problem, credentials)
            self.app = create_app(self.api, clients=clients)
            config = uvicorn.Config(
                BodyDeadline(
                    TracingMiddleware(self.app, metrics),
                    max_body=MAX_BODY_BYTES,
                    timeout=self.body_timeout,
                ),
                http=corked(
                    json_bad_request(
                        head_deadline(
                            self.head_timeout,
                            IdleConnections(self.idle_per_address, self.trusted_proxies),
                        )
                    )
                ),
                # uvicorn believes forwarded headers from loopback unless told otherwise.
                proxy_headers=bool(self.trusted_proxies),
                forwarded_allow_ips=[str(n) for n in self.trusted_proxies],
                timeout_keep_alive=int(KEEP_ALIVE),
                limit_concurrency=MAX_CONNECTIONS,
                h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                log_config=None,
                access_log=False,
                lifespan="on",
                ws="none",
                server_header=False,
                timeout_graceful_shutdown=int(self.shutdown_timeout),
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(views.run(self.snapshot_interval), name="discovery-views")
                sweep = ExpirySweep(store, views, metrics, leases.withdrawals)
                group.create_task(sweep.run(self.expiry_interval), name="lease-expiry")
                group.create_task(self._serve(_Server(config), sock), name="discovery-http")
                group.create_task(fleet.run(), name="fleet-metrics")
                group.create_task(leases.demand.run(), name="pool-demand")
                group.create_task(write_checkpoints(ctx.conn.js), name="time-travel-checkpoints")
        finally:
            sock.close()
            await views.close()

    async def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    await task
                    raise RuntimeError("the discovery HTTP server stopped while starting")
                await asyncio.sleep(0.01)
            self.bound_port = sock.getsockname()[1]
            self.listening.set()
            log.info(
                "discovery listening",
                url=f"http://{self.host}:{self.bound_port}",
                max_lease_ttl=format_duration(self.max_lease_ttl),
                lease_cooldown=format_duration(self.lease_cooldown),
                block_backoff=format_duration(self.block_backoff),
                auth="off" if self.clients is None or self.clients.open else "bearer",
                clients=len(self.clients.table.names) if self.clients else 0,
            )
            # Shielded: cancelling this task must stop the server gracefully, not kill it.
            await asyncio.shield(task)
            raise RuntimeError("the discovery HTTP server stopped on its own")
        finally:
            server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(task, self.shutdown_timeout + 2)
            self.listening.clear()


def parse_trusted_proxies(text: str) -> tuple[Network, ...]:
    """``--trusted-proxies``: addresses and networks, strictly (no host bits, no ``*``)."""
    found = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            found.append(ipaddress.ip_network(item))
        except ValueError:
            raise ConfigError(
                f"--trusted-proxies: {item[:60]!r} is not an address or a network (10.0.0.7, "
                "10.0.0.0/8, fd00::/8, without host bits); list the reverse proxies in front of "
                "the API, comma-separated, or leave it empty"
            ) from None
    return tuple(found)


def build(settings: Settings, config: DiscoverySettings) -> DiscoveryService:
    """The factory ``run discovery`` and ``up`` call. The token and the lease secret come from
    the environment only (a flag would show in ``ps``)."""
    del settings  # the rest arrives through the ServiceContext
    token = token_from_env()
    service = DiscoveryService(
        host=config.host,
        port=config.port,
        max_lease_ttl=config.max_lease_ttl,
        lease_cooldown=config.lease_cooldown,
        block_backoff=config.block_backoff,
        token=token,
        lease_secret=master_secret_from_env(),
        clients=Clients(Path(config.clients_file) if config.clients_file else None, token, log=log),
        egress=config.policy.policy(),
        trusted_proxies=parse_trusted_proxies(config.trusted_proxies),
    )
    service.check()
    return service
