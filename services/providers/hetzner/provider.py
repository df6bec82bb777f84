"""The ``hetzner`` provider: Hetzner Cloud servers through ``hcloud``, and the entry's firewall.

Every call is fire-and-forget: ``create`` returns once Hetzner accepted the server (its id), and
the reconciler follows it by polling ``get``; no action is waited on, so a crash loses nothing.
The client is synchronous, so each call runs in a worker thread (the current span goes with it)
with a per-request timeout and no client-side retries: the reconciler owns retrying, with the
backoff the error class calls for (docs/architecture.md, The provider contract).

Server names are unique in a Hetzner project, so a create is idempotent on ``request.name``: it
looks the name up first, under a per-name lock in this process, and a create that still races
another process gets ``uniqueness_error`` and returns the server that won. The same holds across
locations: a create checks the type against Hetzner's catalogue, then walks the entry's locations
from the one the name's hash picks, moving on when one has no room (D141).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

import structlog
from hcloud import APIException, Client
from hcloud.servers import Server

from services.providers.base import (
    CreateRequest,
    Instance,
    Leftover,
    NotFound,
    Permanent,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from services.providers.cloud.names import NameLocks
from services.providers.cloud.pure.expiring import Expiring
from services.providers.cloud.pure.firewall import firewall_name
from services.providers.cloud.pure.leftovers import firewall_id_of, firewall_leftovers
from services.providers.cloud.pure.settings import client_networks
from services.providers.cloud.pure.userdata import vm_user_data
from services.providers.hetzner import catalogue as hz_catalogue
from services.providers.hetzner import firewall, servers
from services.providers.hetzner import preflight as hz_preflight
from services.providers.hetzner.client import (
    build_client,
    close_client,
    forget_last_answer,
    scrub,
    token_of,
    translate,
)
from services.providers.hetzner.config import HetznerConfig
from services.providers.hetzner.pure import catalogue, mapping
from services.providers.hetzner.servers import FirewallGone, NoRoom, Submission
from services.providers.preflight import Finding
from services.runtime.settings.errors import ConfigError

__all__ = ["HetznerConfig", "HetznerProvider"]

T = TypeVar("T")
log = structlog.get_logger("egress.provider.hetzner")


class HetznerProvider:
    """A ``Provider`` and ``LeftoverCleaner``; see the module docstring. ``page_size`` is the
    listing's page size (for tests)."""

    type = "hetzner"

    def __init__(self, name: str, config: HetznerConfig, *, page_size: int = 50) -> None:
        if not mapping.LABEL_VALUE.match(name):
            raise ConfigError(
                f"the name {name!r} cannot be a Hetzner label value, which every server is "
                "tagged with: start and end it with a letter or digit"
            )
        self.name = name
        self.config = config
        self.page_size = page_size
        self.firewall_name = firewall_name(name)
        self.wanted_rules = mapping.wanted_rules(config.proxy_port, client_networks(config))
        self._client: Client | None = None
        self._client_lock = threading.Lock()
        self._firewall_id: int | None = None
        self._firewall_lock = asyncio.Lock()
        self._names = NameLocks()
        self._types: Expiring[str, catalogue.TypeInfo] = Expiring(size=catalogue.CACHE_SIZE)

    def __repr__(self) -> str:
        return f"HetznerProvider({self.name!r})"

    @classmethod
    def from_config(cls, name: str, config: HetznerConfig) -> HetznerProvider:
        return cls(name, config)

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        what = f"{self.name}: create {request.name}"
        place, labels, user_data = self._plan(request, what)
        placement = request.spec.placement
        location_field, type_field = catalogue.fields(
            placement.zone, placement.region, placement.machine_type
        )
        async with self._names.held(request.name):
            existing = await self._run(
                "create", what, lambda c: servers.find_by_name(c, self.name, request.name, what)
            )
            if existing is not None:
                return existing
            route = (
                [place.location]
                if location_field
                else catalogue.walk(self.config.locations, request.name)
            )
            info = await self.server_type(place.server_type, what)
            problem = catalogue.type_problem(
                info,
                route,
                type_field=type_field,
                location_field=location_field,
                now=datetime.now(UTC),
            )
            if problem:
                raise Permanent(f"{what}: {problem}")
            sent = Submission(self.name, request.name, labels, user_data, what)
            tried: list[tuple[str, str]] = []
            full: list[ProviderError] = []
            for location in route:
                try:
                    return await self._create_in(sent, replace(place, location=location))
                except NoRoom as no_room:
                    tried.append((location, no_room.answer))
                    full.append(no_room.error)
                    log.warning(
                        "no capacity in the location, moving on",
                        provider=self.name,
                        name=request.name,
                        location=location,
                        answer=no_room.answer,
                    )
                except Permanent:
                    self._types.forget(place.server_type)  # the catalogue may have changed
                    raise
            message = catalogue.no_room(place.server_type, tried, location_field=location_field)
            delay = max(error.retry_after for error in full)
            raise QuotaExceeded(f"{what}: {message}", retry_after=delay) from full[-1]

    async def server_type(self, name: str, what: str) -> catalogue.TypeInfo:
        """``name``'s catalogue entry, cached for the instance (``cloud.pure.expiring``)."""
        found = self._types.get(name, time.monotonic())
        if found is None:
            found = await self._run(
                "catalogue",
                f"{what}: server type {name}",
                lambda c: hz_catalogue.server_type(c, name),
            )
            self._types.put(name, found, time.monotonic())
        return found

    async def preflight(self) -> list[Finding]:
        """The entry against Hetzner, read-only (``preflight.py``)."""
        return await hz_preflight.preflight(self)

    async def read(self, what: str, call: Callable[[Client], T]) -> T:
        """One read-only call of the preflight's, translated as every call is."""
        return await self._run("preflight", what, call)

    async def get(self, provider_id: str) -> Instance:
        server_id = mapping.parse_provider_id(provider_id)
        if server_id is None:
            raise NotFound(f"{self.name}: {provider_id!r} is not an id this provider issues")
        return await self._run(
            "get",
            f"{self.name}: get {provider_id}",
            lambda c: servers.instance(c.servers.get_by_id(server_id), self.config.proxy_port),
        )

    async def delete(self, provider_id: str) -> None:
        server_id = mapping.parse_provider_id(provider_id)
        if server_id is None:
            return  # could never have been created

        def delete(client: Client) -> None:
            try:
                client.servers.delete(Server(id=server_id))
            except APIException as exc:
                if exc.code == "not_found":
                    return
                # A delete already under way locks the server: that is the goal reached.
                if exc.code == "locked" and servers.status(client, server_id) in ("deleting", None):
                    return
                raise

        await self._run("delete", f"{self.name}: delete {provider_id}", delete)

    async def list_by_tag(self) -> list[Instance]:
        def listing(client: Client) -> list[Instance]:
            found = client.servers.get_all(label_selector=mapping.label_selector(self.name))
            port = self.config.proxy_port
            return [servers.instance(server, port) for server in found]

        return await self._run("list", f"{self.name}: list", listing)

    async def close(self) -> None:
        # In a thread: the lock may be held by a first call still reading the token.
        await asyncio.to_thread(self._close)

    # ---------------------------------------------------------------- LeftoverCleaner

    async def leftovers(self) -> list[Leftover]:
        """The entry's firewall, once no server of the entry exists in any state."""

        def find(client: Client) -> list[Leftover]:
            if servers.any_server(client, self.name):
                return []
            found = firewall.leftover(client, self.firewall_name, self.name)
            return firewall_leftovers(
                self.name,
                [] if found is None else [(mapping.firewall_leftover_id(found[0]), found[1])],
            )

        return await self._run("leftovers", f"{self.name}: leftovers", find)

    async def delete_leftover(self, leftover: Leftover) -> bool:
        """Delete the firewall unless a server of the entry exists again (False: kept)."""
        firewall_id = firewall_id_of(
            self.name, leftover, mapping.parse_firewall_leftover_id, "firewalls/<id>"
        )

        def delete(client: Client) -> bool:
            if servers.any_server(client, self.name):
                return False
            return firewall.delete(client, firewall_id, self.name)

        async with self._firewall_lock:
            gone = await self._run(
                "delete_leftover", f"{self.name}: delete {leftover.provider_id}", delete
            )
            if gone:
                self._forget_firewall(firewall_id)
            return gone

    # ---------------------------------------------------------------- internals

    def _plan(self, request: CreateRequest, what: str) -> tuple[mapping.Place, dict[str, str], str]:
        """What the server is made of; a spec Hetzner would refuse fails here, Permanent,
        naming the field, before any call."""
        placement = request.spec.placement
        place = mapping.place(
            name=request.name,
            zone=placement.zone,
            region=placement.region,
            machine_type=placement.machine_type,
            image=placement.image,
            locations=self.config.locations,
            default_type=self.config.server_type,
            default_image=self.config.image,
        )
        if isinstance(place, str):
            raise Permanent(f"{what}: {place}")
        if not mapping.SERVER_NAME.match(request.name):
            raise Permanent(
                f"{what}: {request.name!r} is not a valid server name (a hostname: 1-63 "
                "letters, digits and '-', not starting or ending with '-')"
            )
        labels = mapping.server_labels(
            self.name,
            request.owner_uid,
            request.spec_hash,
            namespace=request.namespace,
            proxy_name=request.proxy_name,
        )
        bad = mapping.bad_label(labels)
        if bad is not None:
            key, value = bad
            raise Permanent(
                f"{what}: label {key}={value!r} is not a valid Hetzner label value (at most 63 "
                "letters, digits, '.', '_' or '-', starting and ending with a letter or digit)"
            )
        user_data = vm_user_data(request.cloud_init, self.config, self.name)
        size = len(user_data.encode("utf-8", "surrogatepass"))
        if size > mapping.MAX_USER_DATA:
            raise Permanent(
                f"{what}: the user data is {size} bytes; Hetzner takes at most "
                f"{mapping.MAX_USER_DATA}: shorten spec.cloudInit"
            )
        return place, labels, user_data

    async def _create_in(self, sent: Submission, place: mapping.Place) -> str:
        """One location's create; the firewall made again once if GC deleted it meanwhile."""

        def submit(firewall_id: int) -> Callable[[Client], str]:
            return lambda c: servers.submit(c, self.config, sent, place, firewall_id)

        firewall_id = await self._firewall()
        try:
            server_id = await self._run("create", sent.what, submit(firewall_id))
        except FirewallGone:
            self._forget_firewall(firewall_id)  # deleted by GC meanwhile: make it again
            firewall_id = await self._firewall()
            try:
                server_id = await self._run("create", sent.what, submit(firewall_id))
            except FirewallGone as gone:
                self._forget_firewall(firewall_id)
                raise Transient(f"{sent.what}: the firewall vanished twice: {gone}") from gone
        log.info(
            "server create accepted",
            provider=self.name,
            id=server_id,
            name=sent.name,
            location=place.location,
            server_type=place.server_type,
        )
        return server_id

    async def _firewall(self) -> int:
        """The firewall's id: cached after the first create found or made it."""
        async with self._firewall_lock:
            if self._firewall_id is None:
                self._firewall_id = await self._run(
                    "create",
                    f"{self.name}: firewall {self.firewall_name}",
                    lambda c: firewall.ensure(c, self.firewall_name, self.name, self.wanted_rules),
                )
            return self._firewall_id

    def _forget_firewall(self, firewall_id: int) -> None:
        if self._firewall_id == firewall_id:
            self._firewall_id = None

    def _client_now(self) -> Client:
        """Built on first use, in a worker thread: reading the token file is I/O."""
        with self._client_lock:
            if self._client is None:
                client = build_client(self.config)
                client.servers.max_per_page = self.page_size
                self._client = client
            return self._client

    def _drop_client(self, client: Client) -> None:
        """After Hetzner refused the token: the next call reads it again (a rotated Secret)."""
        with self._client_lock:
            if self._client is client:
                self._client = None
        close_client(client)

    def _close(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            close_client(client)

    async def _run(self, op: str, what: str, call: Callable[[Client], T]) -> T:
        def guarded() -> T:
            forget_last_answer()
            client = self._client_now()
            try:
                return call(client)
            except (ProviderError, FirewallGone, NoRoom):
                raise
            except Exception as exc:
                scrub(exc, token_of(client))
                translated = translate(exc, op=op, what=what)
                if translated is None:
                    raise
                if isinstance(exc, APIException) and exc.code == "unauthorized":
                    self._drop_client(client)
                raise translated from exc

        return await asyncio.to_thread(guarded)
