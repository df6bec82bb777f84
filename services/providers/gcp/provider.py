"""The ``gcp`` provider: four Compute Engine calls (insert, get, delete, aggregatedList).

Every call is fire-and-forget: ``create`` returns once GCE has accepted the insert operation and
the reconciler follows progress by polling ``get``; nothing waits on an operation, so a crash
loses nothing. The client is synchronous, so each call runs in a worker thread (the current span
goes with it) with a per-request timeout and no client-side retries: the reconciler owns retrying,
with the backoff the error class calls for.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import structlog
from google.api_core import exceptions as core
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from services.providers.base import (
    MANAGED_LABEL,
    OWNER_LABEL,
    CreateRequest,
    Instance,
    NotFound,
    Permanent,
    ProviderError,
)
from services.providers.cloud.pure.guard import with_guard
from services.providers.gcp.catalogue import Catalogue
from services.providers.gcp.client import (
    SCOPES,
    already_exists,
    build,
    operation_error,
    translate,
)
from services.providers.gcp.config import RFC1035, GcpConfig
from services.providers.gcp.preflight import preflight
from services.providers.gcp.pure import boot, mapping
from services.providers.gcp.pure.checks import is_custom, machine_type_in, not_offered
from services.providers.preflight import Finding

__all__ = ["GcpConfig", "GcpProvider"]

T = TypeVar("T")
C = TypeVar("C")
log = structlog.get_logger("egress.provider.gcp")


class GcpProvider:
    """A ``Provider`` creating one VM per instance; see the module docstring.

    ``full_payloads`` overrides the process-wide wire-log setting, ``page_size`` the listing's
    page size and ``credentials`` the ADC lookup: all three exist for tests.
    """

    type = "gcp"

    def __init__(
        self,
        name: str,
        config: GcpConfig,
        *,
        full_payloads: bool | None = None,
        page_size: int = 500,
        credentials: Credentials | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.full_payloads = full_payloads
        self.page_size = page_size
        self.credentials = credentials
        self._clients: dict[Any, Any] = {}
        self._client_lock = threading.Lock()
        self.catalogue = Catalogue(
            lambda: self.client(compute_v1.MachineTypesClient),
            config.project,
            config.timeout_seconds,
        )

    @classmethod
    def from_config(cls, name: str, config: GcpConfig) -> GcpProvider:
        return cls(name, config)

    # ---------------------------------------------------------------- Provider

    async def create(self, request: CreateRequest) -> str:
        zone, instance = self._instance_for(request)
        pid = mapping.provider_id(zone, request.name)
        what = f"{self.name}: create {pid}"

        def insert() -> str:
            self._check_offered(zone, instance.machine_type, what)
            try:
                operation = self._instances().insert_unary(
                    project=self.config.project,
                    zone=zone,
                    instance_resource=instance,
                    timeout=self.config.timeout_seconds,
                    retry=None,
                )
            except core.Conflict as exc:
                if not already_exists(exc):
                    raise
                return pid  # the deterministic name exists: a repeated create
            failed = operation_error(operation, op="create", what=what)
            if failed is not None:
                raise failed
            log.info("instance insert accepted", provider=self.name, id=pid, op=operation.name)
            return pid

        return await self._run("create", what, insert)

    async def get(self, provider_id: str) -> Instance:
        parsed = mapping.parse_provider_id(provider_id)
        if parsed is None:
            raise NotFound(f"{self.name}: {provider_id!r} is not an id this provider issues")
        zone, name = parsed

        def get() -> Instance:
            raw = self._instances().get(
                project=self.config.project,
                zone=zone,
                instance=name,
                timeout=self.config.timeout_seconds,
                retry=None,
            )
            return to_instance(raw, zone)

        return await self._run("get", f"{self.name}: get {provider_id}", get)

    async def delete(self, provider_id: str) -> None:
        parsed = mapping.parse_provider_id(provider_id)
        if parsed is None:
            return  # could never have been created
        zone, name = parsed
        what = f"{self.name}: delete {provider_id}"

        def delete() -> None:
            try:
                operation = self._instances().delete_unary(
                    project=self.config.project,
                    zone=zone,
                    instance=name,
                    timeout=self.config.timeout_seconds,
                    retry=None,
                )
            except core.NotFound:
                return
            failed = operation_error(operation, op="delete", what=what)
            if failed is not None:
                raise failed

        await self._run("delete", what, delete)

    async def list_by_tag(self) -> list[Instance]:
        def listing() -> list[Instance]:
            request = compute_v1.AggregatedListInstancesRequest(
                project=self.config.project,
                filter=mapping.list_filter(self.name),
                max_results=self.page_size,
            )
            pages = self._instances().aggregated_list(
                request=request, timeout=self.config.timeout_seconds, retry=None
            )
            found: list[Instance] = []
            # The pager fetches further pages while iterating: keep it inside this thread.
            for scope, scoped in pages:
                zone = mapping.short_name(scope)
                found.extend(to_instance(raw, zone) for raw in scoped.instances)
            return found

        return await self._run("list", f"{self.name}: list", listing)

    async def close(self) -> None:
        # In a thread: the lock may be held by a first call still looking for credentials.
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._client_lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.transport.close()

    # ---------------------------------------------------------------- Preflight

    async def preflight(self) -> list[Finding]:
        """The entry checked against GCE, read-only (``gcp/preflight.py``)."""
        return await preflight(self)

    # ---------------------------------------------------------------- internals

    def client(self, client_class: Callable[..., C]) -> C:
        """A Compute client of ``client_class``, built on first use, in a worker thread:
        finding ADC may ask the metadata server."""
        with self._client_lock:
            found = self._clients.get(client_class)
            if found is None:
                found = build(
                    client_class, self.name, self.config, self.full_payloads, self.credentials
                )
                self._clients[client_class] = found
            # Keyed by the client class: the value is that class's instance, which a dict's
            # type cannot tie to its key.
            return cast("C", found)

    def _instances(self) -> compute_v1.InstancesClient:
        return self.client(compute_v1.InstancesClient)

    def _check_offered(self, zone: str, machine_type: str, what: str) -> None:
        """Refuse, Permanent, a machine type the zone's catalogue lacks, naming the zones that
        offer it; a catalogue that cannot be read leaves the judgement to the insert."""
        zone, name = machine_type_in(zone, machine_type)
        if is_custom(name):
            return
        try:
            if self.catalogue.guest_cpus(zone, name) is not None:
                return
            zones = self.catalogue.zones_offering(name)
        except Exception as exc:
            if translate(exc, op="get", what=what) is None:
                raise
            log.warning(
                "machine type catalogue not read; the insert will tell",
                provider=self.name,
                zone=zone,
                machine_type=name,
                error=f"{type(exc).__name__}: {exc}",
            )
            return
        raise Permanent(f"{what}: {not_offered(name, zone, zones)}")

    async def _run(self, op: str, what: str, call: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(call)
        except ProviderError:
            raise
        except Exception as exc:
            translated = translate(exc, op=op, what=what)
            if translated is None:
                raise
            raise translated from exc

    def _instance_for(self, request: CreateRequest) -> tuple[str, compute_v1.Instance]:
        """The insert body; a spec GCE would refuse fails here, Permanent, naming the field."""
        placement = request.spec.placement
        zone = placement.zone or self.config.zone
        where = f"{self.name}: create {request.name}"
        if not zone:
            raise Permanent(
                f"{where}: no zone: set spec.placement.zone, or gcp.zone in the providers config"
            )
        if not RFC1035.match(zone):
            raise Permanent(f"{where}: spec.placement.zone {zone!r} is not a zone name")
        if placement.region and not zone.startswith(f"{placement.region}-"):
            raise Permanent(
                f"{where}: spec.placement.zone {zone!r} is not in spec.placement.region "
                f"{placement.region!r}; make them agree or leave the region out"
            )
        if not RFC1035.match(request.name):
            raise Permanent(
                f"{where}: {request.name!r} is not a valid instance name (1-63 lowercase "
                "letters, digits and '-', starting with a letter)"
            )
        labels = {
            MANAGED_LABEL: "true",
            OWNER_LABEL: request.owner_uid,
            mapping.PROVIDER_LABEL: mapping.provider_label_value(self.name),
        }
        if request.spec_hash:
            labels[mapping.SPEC_HASH_LABEL] = request.spec_hash[:63]
        labels |= mapping.identity(request.namespace, request.proxy_name)
        for key, value in labels.items():
            if mapping.label_value(value) is None:
                raise Permanent(
                    f"{where}: {key}={value!r} is not a valid GCE label value (at most 63 "
                    "lowercase letters, digits, '_' or '-')"
                )
        image = request.spec.placement.image or self.config.image
        if boot.boot_of(image) is boot.Boot.GUEST_AGENT:
            for part in boot.not_run(boot.parts(request.cloud_init)):
                raise Permanent(
                    f"{where}: spec.cloudInit part {part.name} is {part.kind}, which image "
                    f"{image!r} never runs: it has no cloud-init, and its guest agent runs the "
                    "startup-script, shell only. Write the cloudInit as a shell script "
                    "(#!/bin/sh), or choose an image with cloud-init, e.g. "
                    f"{UBUNTU_IMAGE} (spec.placement.image or gcp.image)"
                )
        return zone, self._body(request, zone, mapping.labels_to_gcp(labels))

    def _body(
        self, request: CreateRequest, zone: str, labels: dict[str, str]
    ) -> compute_v1.Instance:
        config, placement = self.config, request.spec.placement
        image = placement.image or config.image
        machine_type = placement.machine_type or config.machine_type
        if "/" not in machine_type:
            machine_type = f"zones/{zone}/machineTypes/{machine_type}"
        network = config.network
        if "/" not in network:
            network = f"projects/{config.project}/global/networks/{network}"
        subnetwork = config.subnetwork
        if subnetwork and "/" not in subnetwork:
            subnetwork = f"regions/{zone.rsplit('-', 1)[0]}/subnetworks/{subnetwork}"
        instance = compute_v1.Instance(
            name=request.name,
            description=f"egress proxy {request.namespace}/{request.proxy_name}",
            machine_type=machine_type,
            labels=labels,
            disks=[
                compute_v1.AttachedDisk(
                    boot=True,
                    auto_delete=True,
                    initialize_params=compute_v1.AttachedDiskInitializeParams(
                        source_image=image,
                        disk_size_gb=config.disk_size_gb,
                    ),
                )
            ],
            network_interfaces=[
                compute_v1.NetworkInterface(
                    network=network,
                    subnetwork=subnetwork or None,
                    # One ephemeral external IP: a replacement gets a new one.
                    access_configs=[
                        compute_v1.AccessConfig(name="external-nat", type_="ONE_TO_ONE_NAT")
                    ],
                )
            ],
        )
        if config.network_tag:
            instance.tags = compute_v1.Tags(items=[config.network_tag])
        # The image's Squid gets the destination rules and the metadata guard (D134).
        user_data = with_guard(request.cloud_init, config.allowed_targets, snippet=True)
        instance.metadata = compute_v1.Metadata(items=metadata_items(user_data, image))
        if config.service_account:
            instance.service_accounts = [
                compute_v1.ServiceAccount(email=config.service_account, scopes=SCOPES)
            ]
        return instance


UBUNTU_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"


def metadata_items(user_data: str, image: str) -> list[compute_v1.Items]:
    """The user data under the key(s) the image runs (D140): ``user-data`` for cloud-init,
    its shell parts as ``startup-script`` for the guest agent, both for an image not known."""
    keys = boot.keys_for(boot.boot_of(image))
    items: list[compute_v1.Items] = []
    if boot.USER_DATA in keys:
        items.append(compute_v1.Items(key=boot.USER_DATA, value=user_data))
    if boot.STARTUP_SCRIPT in keys:
        script = boot.startup_script(user_data, with_user_data=boot.USER_DATA in keys)
        items.append(compute_v1.Items(key=boot.STARTUP_SCRIPT, value=script))
    return items


def external_ip(raw: compute_v1.Instance) -> str:
    for interface in raw.network_interfaces:
        for access in interface.access_configs:
            if access.nat_i_p:
                return access.nat_i_p
    return ""


def to_instance(raw: compute_v1.Instance, zone: str) -> Instance:
    ip = external_ip(raw)
    labels = mapping.labels_from_gcp(dict(raw.labels))
    created_at = mapping.parse_timestamp(raw.creation_timestamp)
    labels.update(mapping.created_at_label(created_at))
    return Instance(
        provider_id=mapping.provider_id(mapping.short_name(raw.zone) or zone, raw.name),
        name=raw.name,
        state=mapping.state_of(raw.status, ip),
        owner_uid=labels.get(OWNER_LABEL, ""),
        created_at=created_at,
        ip=ip,
        instance_uid=str(raw.id) if raw.id else "",
        labels=labels,
    )
